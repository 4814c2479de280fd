#!/usr/bin/env bash
# Measures full backup and restore throughput against the disk's sequential write
# and read speed (dd, O_DIRECT) in the same run.
#   scripts/backup-measure.sh [KILN_BINARY] [DOCS] [WORK_DIR]
# Generates DOCS documents of ~1 KiB (random hex: lz4 gains ~2x, not more), imports
# them into a server, backs the database up over HTTP (live) and offline, restores it.
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
echo "restore (verified, synced, renamed): $(secs $t0 $t1) s, $(python3 -c "import json;j=json.load(open('$W/restore.json'));print('%.1f MB/s of data, %.1f MB/s of file' % (j['data_bytes']/1e6/$(secs $t0 $t1), j['file_bytes']/1e6/$(secs $t0 $t1)))")"
echo "restored database: $(du -sm "$W/restored/databases/bench" | cut -f1) MiB on disk"
