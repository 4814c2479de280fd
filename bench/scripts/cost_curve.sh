#!/usr/bin/env bash
# The cost curve past RAM (issue 41, part 2; docs/cost-curve.md): for each size N
# (default 1M and 10M documents of ~1.1 KB), `kiln-bench --workloads CURVE` loads N
# documents into a fresh kiln serve without a memory limit, restarts it inside a
# memory cgroup of 2 GiB (page cache included), and measures point GETs, PUTs, YCSB B
# and an index query on the cold cache (bench/src/curve.rs).
#
# By hand, as root, not in .ci/run: 10M documents take ~29 GB of disk and the CI
# machine has ~25 GB free. A size is skipped (and said so) when the disk would keep
# less than KEEP_FREE_GB (default 15) free after it.
#
# The cgroup: this machine has the cgroup v1 memory controller
# (/sys/fs/cgroup/memory); v2's is not enabled here. In v1 the page cache a process
# faults in is charged to its cgroup, so the 2 GiB bound holds the server's RSS and
# the data file's cached pages together.
# ENGINES=kiln,postgres measures PostgreSQL's jsonb table too (its postmaster and
# every backend in the same cgroup); the default is kiln alone.
#   KILN_BIN=target/release/kiln BENCH=bench/target/release/kiln-bench bench/scripts/cost_curve.sh [N ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
CG="${CG:-/sys/fs/cgroup/memory/kiln-curve}"
LIMIT_BYTES="${LIMIT_BYTES:-$((2 << 30))}"
KEEP_FREE_GB="${KEEP_FREE_GB:-15}"
DIR="${DIR:-/work/curve-data}"
OUT="${OUT:-/work/curve-results}"
SECONDS_PER_PHASE="${SECONDS_PER_PHASE:-30}"
ENGINES="${ENGINES:-kiln}"
BENCH="${BENCH:-${CARGO_TARGET_DIR:-bench/target}/release/kiln-bench}"
[ -x "$BENCH" ] || { echo "build bench/ first: cargo build --release --manifest-path bench/Cargo.toml (BENCH=$BENCH)" >&2; exit 1; }
[ -d /sys/fs/cgroup/memory ] || { echo "no cgroup v1 memory controller at /sys/fs/cgroup/memory" >&2; exit 1; }
mkdir -p "$CG" "$DIR" "$OUT"
chmod 755 "$DIR"
echo "$LIMIT_BYTES" > "$CG/memory.limit_in_bytes"
echo "cgroup $CG: memory.limit_in_bytes=$(cat "$CG/memory.limit_in_bytes")"
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1000000 10000000)
for n in "${sizes[@]}"; do
  # Kiln held 2,859 MB for 1M of these documents (docs/cost-curve.md), PostgreSQL
  # ~1.5 GB with its WAL; one engine's directory is removed before the next starts.
  need_gb=$(( n * 2900 / 1000000000 + 1 ))
  avail_gb=$(( $(df --output=avail -k "$DIR" | tail -1) / 1024 / 1024 ))
  if (( avail_gb - need_gb < KEEP_FREE_GB )); then
    echo "N=$n: skipped: needs ~${need_gb} GB, ${avail_gb} GB free, ${KEEP_FREE_GB} GB to keep free"
    continue
  fi
  echo "== N=$n (needs ~${need_gb} GB of the ${avail_gb} GB free)"
  "$BENCH" --engines "$ENGINES" --workloads CURVE --ycsb-records "$n" --runs 1 \
    --curve-cgroup "$CG" --curve-seconds "$SECONDS_PER_PHASE" \
    --dir "$DIR" --out "$OUT/curve-$n.json"
  echo "memory.max_usage_in_bytes=$(cat "$CG/memory.max_usage_in_bytes") failcnt=$(cat "$CG/memory.failcnt")"
  echo 0 > "$CG/memory.max_usage_in_bytes" || true
done
