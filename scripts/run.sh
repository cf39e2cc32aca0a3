#!/usr/bin/env bash
# The run command: the whole system on this machine (evora dev). Arguments go to evora dev,
# except --with-pipeline, which first installs what `evora pipeline` needs: PySpark (the
# pipeline extra, ~300 MB, hence opt-in), Java and the PostgreSQL JDBC driver (Debian/Ubuntu).
set -euo pipefail
# shellcheck source=scripts/_env.sh
. "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

with_pipeline=0
args=()
for arg in "$@"; do
    if [ "$arg" = --with-pipeline ]; then with_pipeline=1; else args+=("$arg"); fi
done

ensure_venv local
if [ "$with_pipeline" = 1 ]; then
    python -c 'import pyspark' 2>/dev/null || _pip_install -e '.[local,pipeline]'
    if ! command -v java >/dev/null && [ -z "${JAVA_HOME:-}" ]; then
        apt_install default-jre-headless
    fi
    apt_install libpostgresql-jdbc-java
fi

step "evora dev ${args[*]}"
exec evora dev "${args[@]}"
