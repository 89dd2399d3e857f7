# Shared by scripts/test, scripts/demo and scripts/bench (sourced, not run).

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/mpi.env"
PYTHON=${PYTHON:-python3}

# ensure_venv DIR EXTRAS [PACKAGE...]: create DIR with pycoll installed
# (editable) with EXTRAS, and the PACKAGEs given (pinned by the caller: torch is
# torch==2.13.0, the CPU build, never a range that lets pip pick a CUDA build),
# unless it is already there for the current setup.cfg. Several may run at
# once: the editable install, which writes pycoll's metadata into the source
# tree, takes turns under a lock.
WARM_IMPORTS='
import importlib.util
import numba, numpy, pytest, pycoll.collectives.reduce, pycoll.kernels.elementwise
if importlib.util.find_spec("torch"):
    import torch, torch._dynamo, torch._inductor.compile_fx
'
ensure_venv() {
    local dir="$ROOT/$1" extras=$2 stamp
    shift 2
    stamp="$extras $* $(cksum < "$ROOT/setup.cfg")"
    if [ -f "$dir/.pycoll-installed" ] && [ "$(cat "$dir/.pycoll-installed")" = "$stamp" ]; then
        return 0
    fi
    echo "== setting up ${dir#"$ROOT"/} with pycoll[$extras] $* (log: ${dir#"$ROOT"/}/install.log)"
    [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir" || return 1
    # --no-compile: pip would byte-compile every module it installs (torch's
    # thousands, twice); Python compiles, and caches, what is imported.
    if ! { "$dir/bin/python" -m pip install --no-compile --upgrade pip &&
           { [ $# -eq 0 ] || "$dir/bin/python" -m pip install --no-compile "$@"; } &&
           flock "$ROOT/.venv-setup.lock" "$dir/bin/python" -m pip install --no-compile \
               -e "$ROOT[$extras]"; } \
        > "$dir/install.log" 2>&1; then
        tail -n 40 "$dir/install.log"
        # (a CI run once failed here on a full disk: say how much was left)
        df -Pk "$ROOT" | awk 'NR == 2 { printf "== disk: %d MiB free on %s\n", $4 / 1024, $6 }'
        return 1
    fi
    # The bytecode of what the suite's processes import, written once here (one
    # process), not by every rank of a pass at once: torch.compile's modules
    # alone are 13 s of CPU to compile, 4 ranks at a time in a 4-rank pass.
    env -u PYTHONDONTWRITEBYTECODE "$dir/bin/python" -c "$WARM_IMPORTS" >> "$dir/install.log" 2>&1 || true
    echo "$stamp" > "$dir/.pycoll-installed"
}

# clean_stale_shm: remove Open MPI's shared-memory segments in /dev/shm that no
# live process maps (left by a job that was killed: a later job whose name
# comes round again can crash on one). Says how many went. Run before and
# after the passes.
clean_stale_shm() {
    "$PYTHON" - <<'PY'
import glob, os
segments = {
    path
    for path in glob.glob("/dev/shm/sm_segment.*") + glob.glob("/dev/shm/vader_segment.*")
    if os.stat(path).st_uid == os.getuid()  # this user's only
}
for maps in glob.glob("/proc/[0-9]*/maps"):
    try:
        with open(maps) as f:
            segments -= {line.split()[-1] for line in f if "/dev/shm/" in line}
    except OSError:  # the process ended, or is not ours to read
        pass
for path in sorted(segments):
    try:
        os.unlink(path)
    except OSError:
        pass
if segments:
    print(f"== removed {len(segments)} stale Open MPI shared-memory segment(s) from /dev/shm")
PY
}
