#!/usr/bin/env bash
# The test command (CI runs exactly this through .ci/run). Extra arguments go to pytest.
set -euo pipefail
# shellcheck source=scripts/_env.sh
. "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

ensure_venv

step "ruff check"
ruff check .
step "ruff format --check"
ruff format --check .
step "mypy"
mypy shared/evora services
step "pytest${*:+ $*}"
status=0
pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "error: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
