#!/usr/bin/env bash
# Runs the Python client's tests against a real `kiln serve` (see tests/conftest.py):
# makes a venv, installs the package with its test extras from PyPI, runs pytest.
#   KILN_BIN   the server binary (default: <repo>/target/release/kiln, built if missing)
#   VENV       where to make the venv (default: clients/python/.venv)
#   PYTHON     the interpreter to make it with (default: python3; needs >= 3.9)
# Extra arguments go to pytest. Exits non-zero on any failure, and when no test ran.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${VENV:-$here/.venv}"
python="${PYTHON:-python3}"

"$python" -c 'import sys; assert sys.version_info >= (3, 9), sys.version' \
  || { echo "run_tests.sh: $python is older than 3.9" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "$here[test]"

cd "$here"
status=0
"$venv/bin/python" -m pytest tests "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "run_tests.sh: pytest collected no tests: counted as a failure" >&2
  exit 5
fi
exit "$status"
