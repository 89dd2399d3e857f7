"""pycoll's collectives on torch CPU tensors against the same calls on numpy
arrays and raw mpi4py's on the tensors' memory.

A program that holds torch tensors passes them to pycoll as they are; each
call finds the tensors' numpy views (pycoll.torchcompat). Per collective and
size, three sides, every result checked once on every rank before the
timing: ``tensor`` (pycoll on the tensors), ``numpy`` (pycoll on numpy
arrays of the same size) and ``mpi4py`` (mpi4py's call on numpy views of the
tensors made once, the floor a Python caller reaches; in place where
pycoll's call is). Then rounds, the order rotated each round; a figure is
the median over rounds of the slowest rank's mean per call, each ratio the
median of the per-round ratios to ``mpi4py``. Not part of pycoll; run with
torch installed (``.venv-torch``):

    mpiexec -n 2 python docs/measurements/torch_tensors.py [ROUNDS] [BYTES,...]

ROUNDS (7); BYTES, each rank's array (default 8 and 65536). With
PYTHONPATH naming another checkout it measures that one: alternate runs to
compare two versions.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import numpy as np
import torch
from measuring import rounds_and_sizes, world

import pycoll
from pycoll.bench.table import _repeat, against, rotated

MPI, comm, n, me = world()
F = MPI.FLOAT
ROUNDS, SIZES = rounds_and_sizes(7, "8,64K")

# A side: its call, and a check that fills its inputs, calls and returns the
# number of elements of its output that differ from what they must be.
Side = Tuple[Callable[[], None], Callable[[], int]]


def cases(k: int) -> Dict[str, Dict[str, Side]]:
    """Per collective, its three sides."""
    mine = np.arange(k, dtype=np.float32) + 100 * me
    every = [np.arange(k, dtype=np.float32) + 100 * r for r in range(n)]
    rows = np.arange(n * k, dtype=np.float32)
    scattered = sum(rows + r for r in range(n))[me * k : (me + 1) * k]
    to_all = np.arange(n * k, dtype=np.float32) + 1000 * me
    received = np.concatenate([np.arange(me * k, (me + 1) * k) + 1000.0 * r for r in range(n)])
    # name: (pycoll's call, mpi4py's, the arrays' sizes (the output first),
    # the input's values, what the output must hold)
    table = {
        "all_reduce": (
            pycoll.all_reduce,
            lambda x: comm.Allreduce(MPI.IN_PLACE, [x, F], MPI.SUM),
            [k], mine, sum(every),
        ),
        "broadcast": (
            lambda x: pycoll.broadcast(x, src=0),
            lambda x: comm.Bcast([x, F], 0),
            [k], mine, every[0],
        ),
        "all_gather_into_tensor": (
            pycoll.all_gather_into_tensor,
            lambda out, x: comm.Allgather([x, F], [out, F]),
            [n * k, k], mine, np.concatenate(every),
        ),
        "reduce_scatter_tensor": (
            pycoll.reduce_scatter_tensor,
            lambda out, x: comm.Reduce_scatter_block([x, F], [out, F], MPI.SUM),
            [k, n * k], rows + me, scattered,
        ),
        "all_to_all_single": (
            pycoll.all_to_all_single,
            lambda out, x: comm.Alltoall([x, F], [out, F]),
            [n * k, n * k], to_all, received,
        ),
    }  # fmt: skip
    made: Dict[str, Dict[str, Side]] = {}
    for name, (ours, raw, sizes, given, want) in table.items():
        made[name] = {}
        for side in ("tensor", "numpy", "mpi4py"):
            if side == "numpy":
                arrays = [np.zeros(s, np.float32) for s in sizes]
                args: List = arrays
            else:
                tensors = [torch.zeros(s) for s in sizes]
                arrays = [t.numpy() for t in tensors]  # (made once: the same memory)
                args = tensors if side == "tensor" else arrays
            f = raw if side == "mpi4py" else ours
            call = lambda f=f, a=args: f(*a)  # noqa: E731

            def check(call=call, a=arrays, given=given, want=want) -> int:
                a[-1][...] = given
                call()
                return int((a[0] != want).sum())

            made[name][side] = (call, check)
    return made


def main() -> None:
    if me == 0:
        print(f"# torch tensors, {n} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print("# us per call (median of rounds); ratio to mpi4py on the tensors' memory")
    for nbytes in SIZES:
        k = max(1, nbytes // 4)
        for name, sides in cases(k).items():
            wrong = comm.allreduce(sum(check() for _, check in sides.values()))
            reps = max(10, int(2e6 // max(nbytes * n, 64)))
            runs = {s: _repeat(call) for s, (call, _) in sides.items()}
            times = {s: [t * 1e6 for t in v] for s, v in rotated(runs, reps, ROUNDS, comm).items()}
            if me == 0:
                line = against(times, "mpi4py")
                print(f"{name:>22} {nbytes:>7} B  wrong {wrong}: {line}", flush=True)
    pycoll.destroy_process_group()


main()
