#!/usr/bin/env bash
# Builds the studio from a clean install and runs its browser tests against a real
# `kiln serve`:
#   KILN_BIN=path/to/kiln bash studio/run_tests.sh          (default: target/release/kiln)
# Needs node/npm and Debian's chromium (apt-get install -y chromium), or CHROMIUM_BIN.
# STUDIO_SKIP_BUILD=1 skips `npm ci && npm run build` (when the caller just did it).
# Screenshots go to docs/studio/ (STUDIO_SCREENSHOTS_DIR to change it).
set -euo pipefail
cd "$(dirname "$0")"
export KILN_BIN="${KILN_BIN:-$PWD/../target/release/kiln}"
export CHROMIUM_BIN="${CHROMIUM_BIN:-/usr/bin/chromium}"
if [ ! -x "$KILN_BIN" ]; then
  echo "studio tests: no kiln binary at $KILN_BIN (cargo build --release --bin kiln, or set KILN_BIN)" >&2
  exit 1
fi
if [ ! -x "$CHROMIUM_BIN" ]; then
  echo "studio tests: no chromium at $CHROMIUM_BIN (apt-get install -y chromium, or set CHROMIUM_BIN)" >&2
  exit 1
fi
if [ "${STUDIO_SKIP_BUILD:-0}" != 1 ]; then
  npm ci --no-audit --no-fund
  npm run build
  # The embedded assets are committed: a rebuild must give the same files.
  if ! git diff --quiet -- dist; then
    echo "studio tests: studio/dist differs from the committed build (commit the rebuilt dist/)" >&2
    git status --short -- dist >&2
  fi
fi
node --test --test-concurrency=1 --test-reporter=spec tests/
