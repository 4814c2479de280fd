#!/usr/bin/env bash
# Runs the TypeScript client's tests against a real `kiln serve` (each test file starts
# its own on a free loopback port, in a temporary data directory): installs the
# dev-dependencies with `npm ci` (package-lock.json), builds (tsc: dist/esm and
# dist/cjs), runs `npm test` (Node's own test runner).
#   KILN_BIN   the server binary (default: <repo>/target/release/kiln; not built here)
#   NODE       the node to use (default: node; needs >= 20)
#   CHROMIUM_BIN  the browser for test/browser.test.mjs (the browser example in headless
#              Chromium; default: `chromium` on the PATH). Without one that test fails,
#              unless KILN_SKIP_BROWSER=1 (then it is skipped and says so).
# Extra arguments go to `node --test` (e.g. --test-name-pattern=cluster).
# Exits non-zero on any failure, and when no test ran.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
node="${NODE:-node}"
export KILN_BIN="${KILN_BIN:-$repo/target/release/kiln}"

"$node" -e 'const v = +process.versions.node.split(".")[0]; if (v < 20) { console.error(`node ${process.version} is older than 20`); process.exit(1); }' \
  || { echo "run_tests.sh: $node is older than Node 20" >&2; exit 1; }
if [ ! -x "$KILN_BIN" ]; then
  echo "run_tests.sh: no kiln binary at $KILN_BIN (cargo build --release -p kiln-cli, or set KILN_BIN)" >&2
  exit 1
fi

cd "$here"
npm ci --no-audit --no-fund --loglevel=error
npm run --silent build

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
# A hung test must not hang CI: each test has 60 s (--test-timeout), the run 5 minutes.
timeout 300 "$node" --experimental-websocket --expose-gc --test --test-timeout=60000 --test-reporter=spec \
  "$@" test/*.test.mjs test/*.test.cjs 2>&1 | tee "$log" || status=$?
pass="$(sed -n 's/^ℹ pass \([0-9]*\)$/\1/p' "$log" | tail -1)"
fail="$(sed -n 's/^ℹ fail \([0-9]*\)$/\1/p' "$log" | tail -1)"
cancelled="$(sed -n 's/^ℹ cancelled \([0-9]*\)$/\1/p' "$log" | tail -1)"
if [ "$status" -eq 0 ] && { [ "${fail:-1}" != "0" ] || [ "${cancelled:-0}" != "0" ]; }; then status=1; fi
if [ "${pass:-0}" -eq 0 ]; then
  echo "run_tests.sh: no test passed (none ran?): counted as a failure" >&2
  [ "$status" -eq 0 ] && status=5
fi
exit "$status"
