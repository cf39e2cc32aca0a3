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
mypy shared/evora evora_services tests bench scripts
step "lint-imports (layering contracts in pyproject.toml)"
lint-imports
# The PySpark pipeline (tests/pipeline) needs a JVM and the PostgreSQL JDBC driver by path;
# Spark never downloads jars at run time here.
if ! command -v java >/dev/null && [ -z "${JAVA_HOME:-}" ]; then
    apt_install openjdk-17-jre-headless
fi
# junixsocket: pgjdbc's socket factory for database URLs that name a Unix socket.
apt_install libpostgresql-jdbc-java libjunixsocket-java
step "pytest${*:+ $*}"
status=0
pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "error: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
