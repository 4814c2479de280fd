# OpenAPI conformance: schemathesis against a real `kiln serve --auth`, every
# operation of docs/openapi.yaml, with schema-valid and schema-invalid requests
# (examples, coverage and fuzzing phases), and every check schemathesis has:
# 5xx answers, statuses, bodies, content types and headers against the document,
# methods it does not list (405 with `Allow`), schema-valid requests refused
# (positive_data_acceptance) and schema-invalid ones accepted
# (negative_data_rejection), invalid credentials accepted (ignored_auth), missing
# required headers, use after delete, resources that vanish. The few operations
# where OpenAPI 3.0 cannot state the server's rule skip one check each, with the
# reason in the config below. Also fails on a panic in the server's log or a
# schemathesis error. Prints the counts: operations, test cases, failures.
#
# Builds nothing. Environment:
#   KILN_BIN       the server binary (default: <repo>/target/release/kiln)
#   SCHEMATHESIS   the schemathesis command (default: schemathesis; 4.x)
#   MAX_EXAMPLES   test cases per operation and phase (default: 40)
#   SEED           hypothesis seed (default: a random one, printed)
#   REPORT_DIR     keep schemathesis's JUnit and NDJSON reports there (default: none)
#   MODE           all (default: schema-valid and schema-invalid requests), positive or negative
#   OPENAPI        the document to check (default: <repo>/docs/openapi.yaml)
#   CHECKS         a,b,c: only those checks (their exceptions below do not apply); default: all
# Further arguments go to `schemathesis run` (e.g. --include-name 'GET /dbs').
# Bounded: the whole run is killed after 600 s (then exit 124).
#
#   pip install 'schemathesis==4.32.5'
#   cargo build --release -p kiln-cli --bin kiln
#   bash scripts/openapi-conformance.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
kiln="${KILN_BIN:-$root/target/release/kiln}"
st="${SCHEMATHESIS:-schemathesis}"
max_examples="${MAX_EXAMPLES:-40}"
seed="${SEED:-$RANDOM$RANDOM}"
schema="${OPENAPI:-$root/docs/openapi.yaml}"

[ -x "$kiln" ] || { echo "openapi-conformance: no kiln binary at $kiln (set KILN_BIN, or cargo build --release -p kiln-cli --bin kiln)" >&2; exit 2; }
command -v "$st" >/dev/null 2>&1 || { echo "openapi-conformance: $st not found: pip install 'schemathesis==4.32.5'" >&2; exit 2; }

work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

data="$work/data"
key="$("$kiln" api-key create --data-dir "$data" --name ci --operator 2>/dev/null)"
[ -n "$key" ] || { echo "openapi-conformance: kiln api-key create printed no key" >&2; exit 1; }
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
base="http://127.0.0.1:$port"

# Short read timeouts keep a stalled request (a truncated body) from holding a
# worker for the default 30 s.
"$kiln" serve --auth --data-dir "$data" --bind "127.0.0.1:$port" \
  --request-read-timeout-ms 5000 >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
  curl -fsS -o /dev/null "$base/health" 2>/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; echo "openapi-conformance: kiln serve exited" >&2; exit 1; }
  sleep 0.1
done
curl -fsS -o /dev/null "$base/health" || { cat "$work/server.log" >&2; exit 1; }

api() { curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" "$@"; }
# Databases the generated requests name (besides random names, which are 404s):
# `shop` with a few documents, an index and a backup chain; `scratch` for the
# operations that create, delete or replace a whole database.
for db in shop scratch; do
  [ "$(api -X PUT "$base/dbs/$db")" = 201 ] || { echo "openapi-conformance: could not create $db" >&2; exit 1; }
done
# users keeps revisions: users/1 has one, the deleted users/3 one marked deleted.
api -X PUT -H 'Content-Type: application/json' --data '{"collections": {"users": {"max_revisions": 5}}}' \
  "$base/dbs/shop/revisions/config" >/dev/null
for i in 1 2 3 1; do
  api -X PUT -H 'Content-Type: application/json' --data "{\"name\": \"user $i\", \"tags\": [\"a\", \"b\"]}" \
    "$base/dbs/shop/docs/users/$i" >/dev/null
done
api -X PUT -H 'Content-Type: application/json' --data '{"fields": ["name"], "collection": "users"}' \
  "$base/dbs/shop/indexes/by-name" >/dev/null
api -X DELETE "$base/dbs/shop/docs/users/3" >/dev/null
api -o /dev/null "$base/dbs/shop/backup?chain=true" >/dev/null

# The dictionaries make most generated requests name an existing database; the
# long poll of /changes is kept short (a schema-valid wait_ms of a minute would
# only make the run slow).
cat >"$work/schemathesis.toml" <<'EOF'
# A valid request may meet a state that refuses it: 410 for an etag of an earlier
# database of the name (a backup's since_etag, a revisions page's `before`).
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "410", "429", "5xx"]

[dictionaries.databases]
values = ["shop"]

[dictionaries.scratch]
values = ["scratch"]

# Disjoint operation sets: a binding for all operations would also apply to those.
[[operations]]
include-path-regex = '^/dbs/\{db\}($|/(?!restore$))'
exclude-name-regex = '^((PUT|DELETE) /dbs/\{db\}|GET /dbs/\{db\}/changes)$'
parameters = { "path.db" = { dictionary = "databases", probability = 0.8 } }

[[operations]]
include-name-regex = '^((PUT|DELETE) /dbs/\{db\}|POST /dbs/\{db\}/restore)$'
parameters = { "path.db" = { dictionary = "scratch", probability = 0.5 } }
# Not names taken from other answers or operations (GET /dbs lists `shop`, the
# other operations' example is `shop`): `shop` is kept.
phases.examples.enabled = false
phases.coverage.extra-data-sources.responses = false
phases.fuzzing.extra-data-sources.responses = false

[[operations]]
include-name = "GET /dbs/{db}/changes"
parameters = { "path.db" = { dictionary = "databases", probability = 0.8 }, "query.wait_ms" = 0 }

# The WebSocket routes answer a complete handshake with 101 Switching Protocols.
[[operations]]
include-path-regex = '/ws$'
checks.not_a_server_error.expected-statuses = ["101", "2xx", "3xx", "4xx"]
checks.positive_data_acceptance.expected-statuses = ["101", "401", "403", "404", "409", "429", "5xx"]

# Where OpenAPI 3.0 cannot state the server's rule, a schema-valid request can
# still be refused (400), rightly; every other check runs on these operations:
# - a query (queries, a subscription's): the schema says "a string", only the
#   parser knows a query;
# - a restore's body: a backup's bytes (its checksums decide);
# - If-Match together with If-None-Match (400 invalid_precondition): a rule
#   across two headers;
# - the revisions config's collection names and a reduce index's aggregate names
#   are an object's keys (`propertyNames` is OpenAPI 3.1);
# - If-Match: schemathesis 4.32.5's coverage phase sends `If-Match: 0` as a
#   schema-valid value though the parameter's pattern excludes it (400
#   invalid_etag, rightly): the operations with If-Match;
# - a new API key: `operator` or `grants` (one of the two), a grant's database a
#   valid name or pattern, a certificate's PEM that parses.
[[operations]]
include-name-regex = '^(POST /admin/api-keys|POST /dbs/\{db\}/(queries|subscriptions|restore|revisions/revert/\{id\})|PUT /dbs/\{db\}/(revisions/config|indexes/\{name\})|(PUT|PATCH|DELETE) /dbs/\{db\}/docs/\{id\}|(PUT|DELETE) /dbs/\{db\}/docs/\{id\}/attachments/\{name\})$'
checks.positive_data_acceptance.enabled = false

# Bulk insert answers 200 as it starts reading (acknowledgements stream while the
# body uploads); a line that is not `{"id", "document"}` is reported in that
# stream (`malformed_json`, with the line and what was committed before it).
[[operations]]
include-name = "POST /dbs/{db}/bulk"
checks.negative_data_rejection.enabled = false

# An attachment is answered with the Content-Type it was stored with: bytes stored
# as application/json need not be JSON (the server keeps what it is given).
[[operations]]
include-name = "GET /dbs/{db}/docs/{id}/attachments/{name}"
checks.response_schema_conformance.enabled = false
EOF

# schemathesis has no serializer for NDJSON (the bulk insert's body): sent as text.
cat >"$work/kiln_schemathesis_hooks.py" <<'EOF'
import schemathesis

schemathesis.serializer.alias("application/x-ndjson", "text/plain")
EOF

# Every check by default (schemathesis's own default), with the per-operation
# exceptions of the config above; CHECKS=a,b,c runs only those (on the command
# line, which overrides the exceptions).
check_args=()
if [ -n "${CHECKS:-}" ] && [ "${CHECKS}" != all ]; then
  check_args=(--checks "$CHECKS")
fi
report_args=(--report junit,ndjson --report-dir "$work/report")
echo "openapi-conformance: schemathesis $("$st" --version | awk '{print $NF}') against $base (kiln serve --auth), seed $seed, $max_examples examples per operation"
status=0
# Run from the temp dir: schemathesis leaves a .schemathesis/ cache where it runs.
(cd "$work" && PYTHONPATH="$work${PYTHONPATH:+:$PYTHONPATH}" SCHEMATHESIS_HOOKS=kiln_schemathesis_hooks \
  timeout 600 "$st" --no-color --config-file "$work/schemathesis.toml" run "$schema" \
  --url "$base" \
  --header "Authorization: Bearer $key" \
  "${check_args[@]}" \
  --mode "${MODE:-all}" \
  --phases examples,coverage,fuzzing \
  --max-examples "$max_examples" \
  --seed "$seed" \
  --workers 1 \
  --request-timeout 40 \
  --generation-database none \
  --suppress-health-check all \
  --warnings off \
  "${report_args[@]}" "$@") >"$work/schemathesis.out" 2>&1 || status=$?
cat "$work/schemathesis.out"

# The counts, from the JUnit report (one testcase per operation).
python3 - "$work/report" "$work/schemathesis.out" <<'EOF' || true
import glob, re, sys, xml.etree.ElementTree as ET
operations = failed = 0
for path in glob.glob(sys.argv[1] + "/*.xml"):
    for case in ET.parse(path).getroot().iter("testcase"):
        operations += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
out = open(sys.argv[2], encoding="utf-8", errors="replace").read()
m = re.search(r"Test cases:\s*(\d+) generated", out)
cases = m.group(1) if m else "?"
m = re.search(r"(\d+) unique failures?", out)
unique = m.group(1) if m else ("0" if failed == 0 else "?")
m = re.search(r"(\d+) errors? in ", out)
errors = m.group(1) if m else "0"
print(f"openapi-conformance: {operations} operations, {cases} test cases, {unique} failures, {errors} errors ({failed} operations failing)")
EOF
if [ -n "${REPORT_DIR:-}" ]; then
  mkdir -p "$REPORT_DIR" && cp -r "$work/report/." "$REPORT_DIR/"
fi
if ! kill -0 "$server_pid" 2>/dev/null; then
  echo "openapi-conformance: kiln serve died during the run" >&2
  tail -50 "$work/server.log" >&2
  status=1
fi
if grep -qE "panicked|ERROR" "$work/server.log"; then
  echo "openapi-conformance: the server logged errors:" >&2
  grep -E "panicked|ERROR" "$work/server.log" | head -20 >&2
  if grep -q "panicked" "$work/server.log"; then status=1; fi
fi
if [ "$status" -ne 0 ]; then
  echo "openapi-conformance: FAILED (exit status $status; seed $seed reproduces it: SEED=$seed)" >&2
  exit 1
fi
echo "openapi-conformance: ok"
