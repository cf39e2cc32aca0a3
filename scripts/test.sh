#!/usr/bin/env bash
# The test command (CI runs exactly this through .ci/run). Extra arguments go to pytest.
set -euo pipefail
# shellcheck source=scripts/_env.sh
. "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

ensure_venv dev

# promtool for tests/deploy (`promtool check rules`, `test rules`): only the binary is taken
# from Debian's `prometheus` package, so no Prometheus daemon is installed or started.
ensure_promtool() {
    [ -x .venv/bin/promtool ] && return 0
    command -v apt-get >/dev/null || return 0
    local tmp
    tmp=$(mktemp -d)
    # `apt-get download` takes no apt lock; the update after it does.
    if ! (cd "$tmp" && "${APT_GET[@]}" download -qq prometheus >/dev/null 2>&1); then
        { [ "$(id -u)" -eq 0 ] && apt_wait_for_locks && "${APT_GET[@]}" update -qq >/dev/null 2>&1; } || true
        (cd "$tmp" && "${APT_GET[@]}" download -qq prometheus >/dev/null 2>&1) || true
    fi
    if ls "$tmp"/prometheus_*.deb >/dev/null 2>&1; then
        step "promtool from Debian's prometheus package"
        dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -xO ./usr/bin/promtool >.venv/bin/promtool
        chmod +x .venv/bin/promtool
    else
        echo "warning: promtool unavailable; alert rules get the structure check only" >&2
    fi
    rm -rf "$tmp"
}
ensure_promtool

# tests/dashboard drive Debian's Chromium headless through Playwright.
apt_install chromium

# tests/e2e/test_replicated.py puts Debian's HAProxy in front of the replicated services;
# without it that test fails, never skips.
apt_install haproxy

# tests/integration/test_pgbouncer.py starts Debian's stock PgBouncer (the pooler most users put
# in front of PostgreSQL) in front of the test server; without it those tests fail.
apt_install pgbouncer

# tests/typescript run the TypeScript SDK's tests (sdks/typescript) with Node.js >= 20 and
# npm. Debian's nodejs may be older; then Node 20 comes from the npm registry's
# node-linux-<arch> package, kept under .venv. Without it those tests fail, never skip.
NODE_MIN_MAJOR=20
_node_major() {
    "$1" --version 2>/dev/null | sed -n 's/^v\([0-9]*\)\..*/\1/p'
}
_node_ok() {
    local major
    major=$(_node_major "$1")
    [ -n "$major" ] && [ "$major" -ge "$NODE_MIN_MAJOR" ]
}
ensure_node() {
    local arch
    case "$(uname -m)" in
        x86_64) arch=x64 ;;
        aarch64) arch=arm64 ;;
        *) arch=$(uname -m) ;;
    esac
    local bin="$REPO_ROOT/.venv/node/node_modules/node-linux-$arch/bin"
    [ -x "$bin/node" ] && export PATH="$bin:$PATH"
    command -v npm >/dev/null || apt_install nodejs npm
    _node_ok node && return 0
    step "Node.js $NODE_MIN_MAJOR from the npm registry (node-linux-$arch)"
    npm install --prefix .venv/node --no-audit --no-fund --no-save "node-linux-$arch@$NODE_MIN_MAJOR"
    export PATH="$bin:$PATH"
    _node_ok node || {
        echo "error: Node.js >= $NODE_MIN_MAJOR is needed for tests/typescript and could not be installed" >&2
        return 1
    }
}
ensure_node
step "node $(node --version), npm $(npm --version 2>/dev/null)"

step "ruff check"
ruff check .
step "ruff format --check"
ruff format --check .
step "mypy"
mypy shared/evora services/evora_services tests bench scripts
step "lint-imports (layering contracts in pyproject.toml)"
lint-imports
# The PySpark pipeline (tests/pipeline) needs a JVM and the PostgreSQL JDBC driver by path;
# Spark never downloads jars at run time here.
if ! command -v java >/dev/null && [ -z "${JAVA_HOME:-}" ]; then
    apt_install openjdk-17-jre-headless
fi
# junixsocket: pgjdbc's socket factory for database URLs that name a Unix socket.
apt_install libpostgresql-jdbc-java libjunixsocket-java

# use_postgres MAJOR: the tests that follow start PostgreSQL MAJOR (tests/conftest.py, through
# EVORA_PG_BIN_DIR), and tests/integration/test_server_version.py checks that they did.
use_postgres() {
    local bin_dir
    bin_dir=$(postgres_bin_dir "$1")
    export EVORA_TEST_PG_MAJOR=$1 EVORA_PG_BIN_DIR=$bin_dir
    # Debian's 15 is the build with JIT; the check makes sure the leg really has it
    if [ "$1" = 15 ]; then export EVORA_TEST_PG_JIT=1; else unset EVORA_TEST_PG_JIT; fi
    [ -n "$bin_dir" ] || unset EVORA_PG_BIN_DIR
}

# run_pytest LABEL ARGS...: pytest, failing on an empty selection too.
run_pytest() {
    local label=$1 status=0
    shift
    step "pytest ($label)${*:+ $*}"
    pytest "$@" || status=$?
    if [ "$status" -eq 5 ]; then
        echo "error: pytest ($label) collected no tests" >&2
        return 1
    fi
    return "$status"
}

# EVORA_PG_MAJOR=N runs the given tests on PostgreSQL N instead of 18 (the wheel's).
[ -z "${EVORA_PG_MAJOR:-}" ] || use_postgres "$EVORA_PG_MAJOR"
status=0
# A full run (CI's) lists its slowest tests (what to look at when the suite's time grows) and
# spreads them over EVORA_TEST_WORKERS pytest processes (default: one per core, at least 2;
# 1 runs them in this process). Each worker starts its own PostgreSQL and MongoDB stand-in, and
# a test file's tests stay on one worker (--dist loadfile: its module fixtures start once).
# Most of a test's time is waiting (for a timer, a lease, a process), so two workers on two
# cores cut the run by about a quarter.
full_run=()
if [ "$#" -eq 0 ]; then
    full_run=(--durations=40)
    workers=${EVORA_TEST_WORKERS:-$(nproc)}
    [ "$workers" -ge 2 ] || [ -n "${EVORA_TEST_WORKERS:-}" ] || workers=2
    # files in collection order, the longest first (tests/conftest.py, LONGEST_FIRST)
    [ "$workers" -le 1 ] || full_run+=(-n "$workers" --dist loadfile --no-loadscope-reorder)
fi
run_pytest "PostgreSQL ${EVORA_PG_MAJOR:-18}" "${full_run[@]}" "$@" || status=$?

# The version matrix: 14 to 18 are supported (docs/deploy.md). The whole suite ran above, on 18;
# each other major runs again the tests whose outcome depends on PostgreSQL itself, ~105 tests,
# ~115 CPU seconds each (PostgreSQL 16, 2026-12-01; the clone each test gets costs ~0.05 s: most
# of it is what test_plan_traps, test_generic_plans and test_store_concurrency run): the
# migrations (syntax, DO blocks, privileges, the catalog's text of an index that `evora migrate`
# builds CONCURRENTLY after them: test_migrations, test_timeline_index, test_listing_by_id,
# sql_enqueue/test_migration, sql_enqueue/test_role), the planner's choices for the hot
# statements (the *_cost tests, test_plan_estimates and test_plan_traps), locking, SKIP LOCKED
# and snapshots under real concurrency (test_store_concurrency, test_fencing,
# sql_enqueue/test_idempotency, sql_enqueue/test_transactions, test_outbox), the projector's
# history check on a server that refuses it (privileges, error codes: test_history_refused), and
# the four services end to end (e2e/test_flow). The rest reaches PostgreSQL only through
# statements these already run, or checks input in PL/pgSQL the same way on every major
# (sql_enqueue/test_validation's ~100 cases). test_server_version makes sure each leg runs on
# the major it names (and 15 with JIT). tests/integration/test_schema.py compares pg_dump's
# text, which differs between majors: 18 only. 15 is Debian's build, with JIT (LLVM); 14, 16 and
# 17 the npm registry's. The legs run in a full run (no pytest arguments, as CI runs it), or for
# the majors EVORA_PG_LEGS names ("none" for none).
PG_LEG_TESTS=(
    tests/integration/test_server_version.py
    tests/integration/test_migrations.py tests/integration/test_timeline_index.py
    tests/integration/test_listing_by_id.py
    tests/sql_enqueue/test_migration.py tests/sql_enqueue/test_role.py
    tests/integration/test_plan_estimates.py tests/integration/test_claim_cost.py
    tests/integration/test_generic_plans.py tests/integration/test_plan_traps.py
    tests/integration/test_ack_cost.py tests/integration/test_limit_usage_cost.py
    tests/integration/test_store_concurrency.py tests/integration/test_fencing.py
    tests/sql_enqueue/test_idempotency.py tests/sql_enqueue/test_transactions.py
    tests/integration/test_outbox.py tests/projector/test_history_refused.py
    tests/e2e/test_flow.py
)
if [ -n "${EVORA_PG_LEGS:-}" ]; then
    read -r -a legs <<<"${EVORA_PG_LEGS/none/}"
elif [ "$#" -eq 0 ] && [ -z "${EVORA_PG_MAJOR:-}" ]; then
    legs=(15 14 16 17) # the longest first (15 also runs the benchmark's harness)
else
    legs=()
fi
failed_legs=()
# The build with JIT also runs the comparison benchmark's harness (Evora's side, tiny counts;
# no figures asserted): the drain a JIT build once made ~6x slower runs there end to end.
PG_JIT_LEG_TESTS=(tests/bench/test_bench_smoke.py)
# No test of a leg uses Hypothesis or Schemathesis, whose pytest plugins import both libraries
# at every start: ~3 of the ~6 CPU seconds a leg's pytest spent before its first test.
PG_LEG_PYTEST_OPTIONS=(-q -n 0 -p no:schemathesis -p no:hypothesispytest)
run_leg() {
    local major=$1 leg_tests=("${PG_LEG_TESTS[@]}")
    [ "$major" != 15 ] || leg_tests+=("${PG_JIT_LEG_TESTS[@]}")
    # a base temporary directory of its own: a pytest session that starts without one makes
    # /tmp/pytest-of-$USER private again (mode 700), and with it the directories of servers a
    # leg running beside it gave to the account PostgreSQL runs as (evora.embedded, as root)
    use_postgres "$major" && run_pytest "PostgreSQL $major leg" "${PG_LEG_PYTEST_OPTIONS[@]}" \
        --basetemp "$leg_logs/$major.tmp" "${leg_tests[@]}"
}
# Each leg is one pytest process, and as many legs run at once as the main run had workers:
# two legs side by side keep both cores as busy as one leg on two workers did, without each
# leg paying its own start twice over or waiting for its slowest worker (4 legs: ~390 s one
# after the other on 2 workers each). The servers are installed first, one at a time (apt and
# npm are not run twice at once); each leg's output is printed whole as it ends.
leg_slots=${workers:-${EVORA_TEST_WORKERS:-$(nproc)}}
[ "$leg_slots" -ge 1 ] || leg_slots=1
leg_logs=$(mktemp -d)
pending_legs=()
for major in "${legs[@]}"; do
    if postgres_bin_dir "$major" >/dev/null; then
        pending_legs+=("$major")
    else
        failed_legs+=("$major")
    fi
done
# print_ended_legs: the output and verdict of every leg that has ended and is not printed yet.
print_ended_legs() {
    local major
    for major in "${pending_legs[@]}"; do
        [ -f "$leg_logs/$major.rc" ] && [ ! -f "$leg_logs/$major.printed" ] || continue
        cat "$leg_logs/$major.log"
        [ "$(cat "$leg_logs/$major.rc")" = 0 ] || failed_legs+=("$major")
        touch "$leg_logs/$major.printed"
    done
}
for major in "${pending_legs[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$leg_slots" ]; do
        wait -n || true
        print_ended_legs
    done
    (
        status=0
        run_leg "$major" || status=$?
        echo "$status" >"$leg_logs/$major.rc"
    ) >"$leg_logs/$major.log" 2>&1 &
done
wait || true
print_ended_legs
rm -rf "$leg_logs"
if ((${#legs[@]})); then
    if ((${#failed_legs[@]})); then
        echo "error: the PostgreSQL ${failed_legs[*]} leg(s) of the version matrix failed" >&2
        status=1
    else
        step "PostgreSQL ${legs[*]} legs passed"
    fi
fi
exit "$status"
