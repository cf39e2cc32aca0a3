# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/run.sh: puts the shell at the repo root with the
# project's venv (.venv) first on PATH and the project installed in it with its dev extra.

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"

step() {
    printf '==> %s\n' "$*"
}

_apt_updated=0

# apt_install PKG...: install the Debian packages that are missing; a no-op when all are there.
apt_install() {
    local pkg missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$pkg")
    done
    ((${#missing[@]})) || return 0
    if ! command -v apt-get >/dev/null; then
        echo "error: these Debian packages are needed but apt-get is missing: ${missing[*]}" >&2
        return 1
    fi
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || {
            echo "error: need root or sudo to install: ${missing[*]}" >&2
            return 1
        }
        sudo=(sudo)
    fi
    step "apt-get install ${missing[*]}"
    if [ "$_apt_updated" -eq 0 ]; then
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        _apt_updated=1
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

_python_ok() {
    "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
}

_find_python() {
    local candidate
    for candidate in python3 python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null && _python_ok "$candidate"; then
            command -v "$candidate"
            return 0
        fi
    done
    echo "error: Python 3.11 or newer is required (looked for python3, python3.13..python3.11)" >&2
    return 1
}

ensure_venv() {
    local venv="$REPO_ROOT/.venv"
    if [ ! -x "$venv/bin/python" ] || ! _python_ok "$venv/bin/python"; then
        local python
        python=$(_find_python)
        step "creating .venv with $python ($("$python" -V 2>&1))"
        # Debian ships venv's pip bootstrap separately (python3.X-venv).
        if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
            apt_install "python3-venv" "$(basename "$(readlink -f "$python")")-venv"
        fi
        rm -rf "$venv"
        "$python" -m venv "$venv"
    fi
    export VIRTUAL_ENV="$venv"
    export PATH="$venv/bin:$PATH"

    # Reinstalling takes seconds even when nothing changed, so it is skipped while
    # pyproject.toml is what was last installed successfully.
    local stamp="$venv/.evora-installed" want
    want=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        step "pip install -e '.[dev]'"
        python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
        printf '%s\n' "$want" >"$stamp"
    fi
}
