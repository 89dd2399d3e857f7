"""One 8-byte dist.all_reduce through the backend "pycoll", against the floor
torch's own API sets for any Python backend.

Four sides on one tensor of two float32s, interleaved round by round (the
order rotated), every side's result checked once first where it has one:

- ``dist.all_reduce``: torch's API on the default group (backend "pycoll");
- ``null backend``: the same call on a group of a Python backend whose
  ``allreduce`` returns a completed Work at once: torch's wrapper and its
  call into Python, the floor any Python backend pays;
- ``pycoll tensor``: ``pycoll.all_reduce`` on the tensor;
- ``pycoll numpy``: ``pycoll.all_reduce`` on a numpy array;
- ``null send+recv``, on 2 ranks: ``dist.send`` then ``dist.recv`` to the
  other rank on the null backend, whose send and recv are complete at once:
  torch's own floor for the pair (``p2p.py ... torch`` times the real one).

What the backend adds is the first side less the second and the fourth. A
figure is the median over rounds of the slowest rank's mean per call. Not
part of pycoll; run with torch installed (``.venv-torch``):

    mpiexec -n 1 python docs/measurements/backend_floor.py [ROUNDS]    # or -n 2

With PYTHONPATH naming another checkout it measures that one: alternate
runs to compare two versions.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist

import pycoll
import pycoll.torch  # noqa: F401  (registers the backend "pycoll")
from pycoll import _mpi
from pycoll.bench.table import _repeat, rotated
from pycoll.torch.work import done

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
_DONE = done([])


class Null(dist.ProcessGroup):
    """A backend that does nothing: its all_reduce is complete at once."""

    def getBackendName(self) -> str:
        return "null"

    def allreduce(self, tensors, opts=None):  # noqa: ANN001, ANN201
        return _DONE

    def send(self, tensors, dst, tag=0):  # noqa: ANN001, ANN201
        return _DONE

    def recv(self, tensors, src, tag=0):  # noqa: ANN001, ANN201
        return _DONE


dist.Backend.register_backend(
    "null", lambda store, rank, size, timeout: Null(rank, size), devices=["cpu"]
)
dist.init_process_group("pycoll", init_method="mpi://")
null = dist.new_group(backend="null")
world = _mpi.MPI.COMM_WORLD
n = world.size
t = torch.ones(2)
a = np.ones(2, np.float32)
for name, call, x in (
    ("dist.all_reduce", lambda: dist.all_reduce(t), t),
    ("pycoll tensor", lambda: pycoll.all_reduce(t), t),
    ("pycoll numpy", lambda: pycoll.all_reduce(a), a),
):
    x.fill(1) if isinstance(x, np.ndarray) else x.fill_(1)
    call()
    if not bool((x == n).all()):
        raise AssertionError(f"{name}: wrong result")
sides = {
    "dist.all_reduce": _repeat(lambda: dist.all_reduce(t)),
    "null backend": _repeat(lambda: dist.all_reduce(t, group=null)),
    "pycoll tensor": _repeat(lambda: pycoll.all_reduce(t)),
    "pycoll numpy": _repeat(lambda: pycoll.all_reduce(a)),
}
if n == 2:
    peer = 1 - world.rank

    def pair() -> None:
        dist.send(t, peer, group=null)
        dist.recv(t, peer, group=null)

    sides["null send+recv"] = _repeat(pair)
times = rotated(sides, 20000, ROUNDS, world, warmup=200)
if world.rank == 0:
    print(f"# 8-byte all_reduce, {n} ranks, torch {torch.__version__}; us per call (median)")
    for name, v in times.items():
        print(f"{name:>16} {np.median(v) * 1e6:7.2f}")
dist.destroy_process_group()
