#!/usr/bin/env bash
# Every measurement of docs/benchmarks.md's GPU-machine sections, and the GPU
# tests, in one run on a lent GPU machine (16 cores, one GPU, Python with
# torch, cupy and numba-cuda, no network). A measurement script, not part of
# pycoll: each step has its own time limit, so one that fails or hangs costs
# only itself, and each writes its own log under $OUT.
#
#   bash docs/measurements/gpu_machine.sh WHEELS OUT [PART...]
#
# PARTs (default: gpu tests paths bench launch kernels): gpu (goal 6's
# staged all_reduce, 2 and 4 ranks; GPU_CHUNKS="4M 0" times fewer chunk
# sizes), gpu2 (the same on 2 ranks alone), tests (the real-GPU tests; with
# kernels, the device kernels' tests too), paths (all_reduce's paths forced,
# 2/4/8 ranks), bench (pycoll-bench, every collective with plans, 2/4
# ranks), allreduce (pycoll-bench's all_reduce from 1 MiB), targets (the
# 16-bit targets alone), launch (pycoll-run's start-up), kernels (the device
# kernels), window (the shared window's chunk size, rank binding, one kernel
# thread a rank), scatter (the reduce-scatters through the window against
# their packed path and MPI's, and goal 4's coalesced forms), tune (a tuning
# table made there for 2 and 4 ranks, and all_reduce and reduce_scatter on 2
# ranks with it against the built-in rule), rs (reduce_scatter_tensor's
# ways forced, against mpi4py's: rs_paths.py, 2 and 4 ranks), coalesced
# (goal 4's coalesced forms, 2 ranks), gpu4 (goal 6 on 4 ranks alone),
# fixed (goal 2's fixed cost on 2 ranks: MPI's call forms in C, pycoll-bench
# to 4 KiB in the default and blocking modes and on the Python path).
#
# WHEELS holds the MPICH wheel, mpi4py's and numpy's for that Python, and
# pycoll's own (python3 -m pip wheel --no-deps -w WHEELS .): the machine's
# host MPI is then the MPICH wheel's, as on CI, in a virtual environment that
# sees the machine's torch, cupy and numba-cuda. numpy is CI's version
# (numba-cuda has not always imported under the image's newer numpy).
set -u
WHEELS=$(cd "$1" && pwd)
OUT=$2
shift 2
PARTS=${*:-gpu tests paths bench launch kernels}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
V=/tmp/pycoll-gpu-venv

step() {  # step LOG LIMIT COMMAND...: COMMAND's output to $OUT/LOG, bounded by LIMIT s
    local log=$OUT/$1 limit=$2 start=$SECONDS
    shift 2
    echo "== $* (limit ${limit} s)" >> "$log"
    timeout --kill-after=5 "$limit" "$@" >> "$log" 2>&1
    echo "== rc $? after $((SECONDS - start)) s" >> "$log"
    echo "$log: $((SECONDS - start)) s"
}

{
    "$PY" -m venv "$V" &&
        "$V/bin/pip" install -q --no-index --no-deps --no-compile "$WHEELS"/*.whl &&
        # the image's packages (torch, cupy, numba-cuda), after the venv's own:
        # its python3 is itself a venv, which --system-site-packages would skip
        "$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
            > "$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/image.pth"
} > "$OUT/setup.txt" 2>&1 || { cat "$OUT/setup.txt"; exit 1; }
export PATH="$V/bin:$PATH"
# Run from a copy of the tests, where the source tree's pycoll/ does not
# shadow the installed package.
T=/tmp/pycoll-gpu-tests
rm -rf "$T" && mkdir -p "$T" && cp -r "$SRC/tests" "$SRC/setup.cfg" "$T/"
cd "$T" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{
    nproc
    nvidia-smi -L 2>&1
    "$V/bin/python" -c "import sys, numpy, mpi4py; print(sys.version); print('numpy', numpy.__version__)"
    "$V/bin/python" -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"
    "$V/bin/python" -c "import numba, numba.cuda; print('numba', numba.__version__, 'cuda', numba.cuda.is_available())"
    "$V/bin/python" -c "import importlib.metadata as m; print('numba-cuda', m.version('numba-cuda'))"
    "$V/bin/python" -c "import cupy; print('cupy', cupy.__version__)"
    "$V/bin/python" -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())"
    "$V/bin/python" -c "import pycoll, pycoll.gpu; print(pycoll.__file__)"
} >> "$OUT/setup.txt" 2>&1
cat "$OUT/setup.txt"

wanted() { [[ " $PARTS " == *" $1 "* ]]; }

if wanted gpu || wanted gpu2; then
    # Goal 6 (issue 23): staged all_reduce of cupy arrays against MPI's host
    # all_reduce and gloo on CUDA tensors, 2 ranks on the one GPU, then 4.
    step gpu_bench.txt 150 mpiexec -n 2 python -m pycoll.bench.gpu -b 1M -e 256M -f 4 \
        -d float32 float16 --chunks ${GPU_CHUNKS:-1M 4M 16M 0} --no-kernels
fi
if wanted gpu || wanted gpu4; then
    step gpu_bench.txt 90 mpiexec -n 4 python -m pycoll.bench.gpu -b 16M -e 256M -f 4 \
        -d float32 -R 3 --chunks 1M 4M 16M 0 --no-kernels
fi
if wanted tests; then
    # The real-GPU tests (skips become failures).
    step gpu_tests.txt 120 env PYCOLL_TEST_GPU=1 python -m pytest -q -p no:cacheprovider \
        --mpi-reuse-all --mpi-timeout 100 --suite-ranks 2 tests/gpu/test_real.py
    wanted kernels && step gpu_tests.txt 90 env PYCOLL_TEST_GPU=1 python -m pytest -q \
        -p no:cacheprovider tests/gpu/test_kernels.py
fi
if wanted paths; then
    # Goal 3 on 16 cores: the three all_reduce paths forced, and the default.
    for n in 2 4 8; do
        step paths.txt 60 mpiexec -n "$n" python "$SRC/docs/measurements/all_reduce_paths.py" 5
    done
fi
if wanted bench; then
    # Goals 1-3 on 16 cores: pycoll-bench against mpi4py and the C floor.
    for n in 2 4; do
        step bench.txt 90 mpiexec -n "$n" python -m pycoll.bench -b 8 -e 128M -f 8 -R 5 --plans
    done
fi
if wanted allreduce; then
    # Goal 3 on 16 cores: all_reduce from 1 MiB against mpi4py, 2 and 4 ranks.
    for n in 2 4; do
        step allreduce.txt 60 mpiexec -n "$n" python -m pycoll.bench -b 1M -e 128M -f 2 -R 5 \
            --collectives all_reduce
    done
fi
if wanted targets; then
    # Goal 3's 16-bit targets on 16 cores.
    step bench.txt 60 mpiexec -n 2 python -m pycoll.bench --targets 5 -b 1M -e 64M -f 4
fi
if wanted launch; then
    # Goal 5: pycoll-run's start-up against bare mpiexec.
    for n in 2 4; do
        step launch.txt 40 python -m pycoll.launch.bench -n "$n" --repeat 10
    done
fi
if wanted kernels; then
    step gpu_bench.txt 60 python -m pycoll.bench.gpu --kernels-only
fi
if wanted tune; then
    # A tuning table measured on 16 cores (pycoll.tuning), and pycoll-bench's
    # all_reduce and reduce_scatter with it and with the built-in rule.
    for n in 2 4; do
        step tune.txt 90 mpiexec -n "$n" python -m pycoll.bench.tune -o "$OUT/tuning.json" \
            -b 1M -e 64M -R 5
    done
    for table in none "$OUT/tuning.json"; do
        step tune.txt 45 env PYCOLL_TUNING="${table#none}" mpiexec -n 2 python \
            -m pycoll.bench --collectives all_reduce,reduce_scatter -b 1M -e 64M -f 4 -R 5 \
            --no-floor
    done
fi
if wanted rs; then
    # reduce_scatter_tensor's three ways forced (MPI's call, the window,
    # pycoll's pairwise exchange) and the default, against mpi4py's call.
    for n in 2 4; do
        step rs.txt 90 mpiexec -n "$n" python "$SRC/docs/measurements/rs_paths.py" 5 \
            1M,2M,4M,16M,64M
    done
fi
if wanted fixed; then
    # Goal 2 on 16 cores: what MPI's blocking, nonblocking-and-tested and
    # persistent calls cost in C, and pycoll's small calls in each mode.
    step fixed.txt 60 mpiexec -n 2 python "$SRC/docs/measurements/mpi_call_forms.py" 5
    for mode in poll blocking; do
        step fixed.txt 60 env PYCOLL_WAIT=$mode mpiexec -n 2 python -m pycoll.bench \
            -b 8 -e 4K -f 8 -R 5 --plans
    done
    step fixed.txt 60 env PYCOLL_NATIVE=0 mpiexec -n 2 python -m pycoll.bench -b 8 -e 4K \
        -f 8 -R 5 --no-floor
fi
if wanted coalesced; then
    # Goal 4 on 16 cores: 1,000 arrays of 1 KiB through the coalesced forms.
    step coalesced.txt 60 mpiexec -n 2 python "$SRC/docs/measurements/coalesced_forms.py" 7 1000
fi
if wanted scatter; then
    # The reduce-scatters through the window on 16 cores: the coalesced one
    # against its packed path (coalesced.SHM_SCATTER_FROM), one array against
    # MPI's (reduce.SCATTER_SHM_BYTES), and goal 4 with and without it.
    for n in 2 4; do
        step scatter.txt 90 mpiexec -n "$n" python "$SRC/docs/measurements/scatter_window.py" 5
        step scatter.txt 90 mpiexec -n "$n" python "$SRC/docs/measurements/scatter_window.py" 5 \
            float32 1M,4M,16M,64M,128M 1
        for mode in packed window; do
            step scatter.txt 60 mpiexec -n "$n" python \
                "$SRC/docs/measurements/coalesced_forms.py" 7 1000 $mode
        done
    done
fi
if wanted window; then
    # The shared window's chunk size, and the ranks bound to cores or not.
    { lscpu; grep . /sys/devices/system/cpu/cpu0/cache/index*/size; } > "$OUT/cpu.txt" 2>&1
    sizes=1M,4M,8M,16M
    for n in 2 4; do
        step window.txt 60 env WINDOW_CHUNKS=256K,512K,1M,4M mpiexec -n "$n" python \
            "$SRC/docs/measurements/all_reduce_paths.py" 5 $sizes
        step window.txt 60 mpiexec -bind-to core -n "$n" python \
            "$SRC/docs/measurements/all_reduce_paths.py" 5 $sizes
        # One thread a rank: whether waking numba's pool for each 2 MiB
        # chunk's copies and sums (pycoll.kernels.threads, from 1 MiB of work)
        # costs the window more than the threads give back on 16 cores, where
        # 2 ranks get 8 threads each and the window was slower than MPICH.
        step window.txt 60 env PYCOLL_NUM_THREADS=1 mpiexec -n "$n" python \
            "$SRC/docs/measurements/all_reduce_paths.py" 5 $sizes
    done
    step window.txt 60 env WINDOW_CHUNKS=512K,1M mpiexec -n 2 python \
        "$SRC/docs/measurements/all_reduce_paths.py" 5 $sizes float16
fi
