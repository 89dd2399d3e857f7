# Shared by scripts/test, scripts/demo and scripts/bench (sourced, not run).

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/mpi.env"
PYTHON=${PYTHON:-python3}

# ensure_venv DIR EXTRAS: create DIR with pycoll installed (editable) with
# EXTRAS, unless it is already there for the current setup.cfg.
ensure_venv() {
    local dir="$ROOT/$1" extras=$2 stamp
    stamp="$extras $(cksum < "$ROOT/setup.cfg")"
    if [ -f "$dir/.pycoll-installed" ] && [ "$(cat "$dir/.pycoll-installed")" = "$stamp" ]; then
        return 0
    fi
    echo "== setting up $1 with pycoll[$extras]"
    [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir" || return 1
    "$dir/bin/python" -m pip install --quiet --upgrade pip || return 1
    "$dir/bin/python" -m pip install --quiet -e "$ROOT[$extras]" || return 1
    echo "$stamp" > "$dir/.pycoll-installed"
}
