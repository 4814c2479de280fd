#!/usr/bin/env bash
# Measures full backup and restore throughput against the disk's sequential write
# and read speed (dd, O_DIRECT) in the same run.
#   scripts/backup-measure.sh [KILN_BINARY] [DOCS] [WORK_DIR]
# Generates DOCS documents of ~1 KiB (random hex: lz4 gains ~2x, not more), imports
# them into a server, backs the database up over HTTP (live) and offline, restores it;
# then a chain: a full backup, every document rewritten, an increment, a restore of
# both (every write replayed) and one to the middle of the increment.
set -euo pipefail
KILN=${1:-target/release/kiln}
DOCS=${2:-300000}
W=${3:-$(mktemp -d /tmp/kiln-backup-measure.XXXXXX)}
mkdir -p "$W"
trap 'kill $SERVER 2>/dev/null || true; rm -rf "$W"' EXIT
SERVER=

now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc -l; }

echo "== disk (dd, 512 MiB, O_DIRECT)"
dd if=/dev/zero of="$W/dd.bin" bs=1M count=512 oflag=direct conv=fsync 2>&1 | tail -1 | sed 's/^/write: /'
dd if="$W/dd.bin" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1 | sed 's/^/read:  /'
rm -f "$W/dd.bin"

python3 - "$DOCS" > "$W/docs.ndjson" <<'PY'
import sys, os, json, binascii
n = int(sys.argv[1])
for i in range(n):
    body = {"n": i, "tag": "t%d" % (i % 100), "blob": binascii.hexlify(os.urandom(480)).decode()}
    sys.stdout.write(json.dumps({"id": "doc/%09d" % i, "document": body}) + "\n")
PY
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$KILN" serve --data-dir "$W/data" --bind 127.0.0.1:$PORT >/dev/null 2>&1 &
SERVER=$!
for _ in $(seq 100); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 0.1; done
curl -sf -X PUT http://127.0.0.1:$PORT/dbs/bench >/dev/null
"$KILN" import --url http://127.0.0.1:$PORT --db bench -q "$W/docs.ndjson" >/dev/null
sync
echo "== database: $(du -sm "$W/data/databases/bench" | cut -f1) MiB on disk, $DOCS documents"

t0=$(now); "$KILN" backup --url http://127.0.0.1:$PORT --db bench --out "$W/online.kbak" -q --json > "$W/online.json"; t1=$(now)
echo "backup over HTTP (live server): $(secs $t0 $t1) s, $(python3 -c "import json;j=json.load(open('$W/online.json'));print('%.0f MB data, %.0f MB file, %.1f MB/s of data, %.1f MB/s of file' % (j['data_bytes']/1e6, j['file_bytes']/1e6, j['data_bytes']/1e6/$(secs $t0 $t1), j['file_bytes']/1e6/$(secs $t0 $t1)))")"
kill -TERM $SERVER; wait $SERVER || true; SERVER=
t0=$(now); "$KILN" backup --data-dir "$W/data" --db bench --out "$W/offline.kbak" -q --json > "$W/offline.json"; t1=$(now)
echo "backup offline (incl. opening the store): $(secs $t0 $t1) s, $(python3 -c "import json;j=json.load(open('$W/offline.json'));print('%.1f MB/s of data' % (j['data_bytes']/1e6/$(secs $t0 $t1)))")"
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
t0=$(now); "$KILN" backup verify "$W/online.kbak" -q --json > /dev/null; t1=$(now)
echo "verify: $(secs $t0 $t1) s"
t0=$(now); "$KILN" restore "$W/online.kbak" --data-dir "$W/restored" --db bench -q --json > "$W/restore.json"; t1=$(now)
echo "restore (verified, synced, renamed): $(secs $t0 $t1) s, $(python3 -c "import json;j=json.load(open('$W/restore.json'));b=j['backups'][0];print('%.1f MB/s of data, %.1f MB/s of file' % (b['data_bytes']/1e6/$(secs $t0 $t1), b['file_bytes']/1e6/$(secs $t0 $t1)))")"
echo "restored database: $(du -sm "$W/restored/databases/bench" | cut -f1) MiB on disk"

echo "== incremental (a chain: full backup, then every document rewritten once, then an increment)"
"$KILN" serve --data-dir "$W/data" --bind 127.0.0.1:$PORT >/dev/null 2>&1 &
SERVER=$!
for _ in $(seq 100); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 0.1; done
"$KILN" backup --url http://127.0.0.1:$PORT --db bench --out "$W/chain-full.kbak" --chain -q --json > /dev/null
t0=$(now); "$KILN" import --url http://127.0.0.1:$PORT --db bench -q "$W/docs.ndjson" >/dev/null; t1=$(now)
echo "rewrite of $DOCS documents with the chain active (bulk import): $(secs $t0 $t1) s"
t0=$(now); "$KILN" backup --url http://127.0.0.1:$PORT --db bench --out "$W/chain-inc.kbak" --incremental-since "$W/chain-full.kbak" -q --json > "$W/inc.json"; t1=$(now)
echo "increment over HTTP: $(secs $t0 $t1) s, $(python3 -c "import json;j=json.load(open('$W/inc.json'));print('%d writes, %.0f MB data, %.0f MB file, %.1f MB/s of data' % (j['entries'], j['data_bytes']/1e6, j['file_bytes']/1e6, j['data_bytes']/1e6/$(secs $t0 $t1)))")"
kill -TERM $SERVER; wait $SERVER || true; SERVER=
t0=$(now); "$KILN" restore "$W/chain-full.kbak" "$W/chain-inc.kbak" --data-dir "$W/restored-chain" --db bench -q --json > "$W/rchain.json"; t1=$(now)
echo "restore full + increment (replaying every write): $(secs $t0 $t1) s, $(python3 -c "import json;j=json.load(open('$W/rchain.json'));print('%d writes replayed, %.0f writes/s over the whole restore' % (j['writes_replayed'], j['writes_replayed']/$(secs $t0 $t1)))")"
MID=$(python3 -c "import json;j=json.load(open('$W/inc.json'));b=int(j['base_etag'].split('-')[0]);e=int(j['etag'].split('-')[0]);print('%d-%s' % ((b+e)//2, j['etag'].split('-')[1]))")
t0=$(now); "$KILN" restore "$W/chain-full.kbak" "$W/chain-inc.kbak" --data-dir "$W/restored-pitr" --db bench --until "etag:$MID" -q --json > "$W/rpitr.json"; t1=$(now)
echo "restore to the middle of the increment (etag $MID): $(secs $t0 $t1) s, $(python3 -c "import json;j=json.load(open('$W/rpitr.json'));print('reached %s, %d replayed, %d after the point' % (j['reached']['etag'], j['writes_replayed'], j['writes_skipped']))")"
