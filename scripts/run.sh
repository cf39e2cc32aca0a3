#!/usr/bin/env bash
# The run command: the whole system on this machine (evora dev). Arguments go to evora dev.
set -euo pipefail
# shellcheck source=scripts/_env.sh
. "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

ensure_venv local

step "evora dev $*"
exec evora dev "$@"
