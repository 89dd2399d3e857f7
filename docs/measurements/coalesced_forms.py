"""Every coalesced form on ARRAYS float32 arrays of 1 KiB, against the one
call of the total size it stands for, in one run: how far each is from
issue 23's goal 4 (within 2x that one call).

- all_reduce_coalesced (pycoll's) and functional all_reduce_coalesced,
  against one 1 MiB all_reduce;
- all_gather_coalesced, all_gather_into_tensor_coalesced (pycoll's) and
  functional all_gather_into_tensor_coalesced, against one
  all_gather_into_tensor of 1 MiB per rank;
- reduce_scatter_tensor_coalesced (pycoll's) and functional
  reduce_scatter_tensor_coalesced, against one reduce_scatter_tensor of
  1 MiB per rank's part.

pycoll's imperative forms get the same array objects every call, as a
training loop gives them, so from the second call they run on the plan the
group keeps; the functional forms make new results every call.

The functional forms' every result is read (waited for). Every case's result
is checked once on every rank first; then rounds of a block of 3 calls each,
the order rotated every round; each case's median time and its median
per-round ratio to its one call are printed on rank 0. A measurement for
docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/coalesced_forms.py         # 7 rounds, 1000 arrays
    mpiexec -n 4 python docs/measurements/coalesced_forms.py 7 1000
    mpiexec -n 2 python docs/measurements/coalesced_forms.py 7 1000 packed

``packed`` sends the coalesced reduce-scatter by its packed path (pack,
MPI's reduce-scatter, unpack) instead of the node's shared window, as
before the window path existed.
"""

import sys

import numpy as np

import pycoll
from pycoll import _mpi
from pycoll import functional as F
from pycoll.bench.table import time_block
from pycoll.collectives import coalesced

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
K = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
if sys.argv[3:] == ["packed"]:
    coalesced.SHM_SCATTER_FROM = 0
C = 256  # float32 elements per array: 1 KiB

xs = [np.full(C, me + 1 + i % 7, np.float32) for i in range(K)]
outs = [[np.empty(C, np.float32) for _ in range(K)] for _ in range(n)]
gathered_outs = [np.empty(C * n, np.float32) for _ in range(K)]
one = np.concatenate(xs)
one_out = np.empty(C * K * n, np.float32)
rs_in = [np.full(C * n, me + 1 + i % 7, np.float32) for i in range(K)]
rs_one_in = np.concatenate(rs_in)
rs_one_out = np.empty(C * K, np.float32)
rs_outs = [np.empty(C, np.float32) for _ in range(K)]
total = n * (n + 1) // 2  # sum over ranks of (rank + 1)


def sum_of(i):
    return np.full(C, total + n * (i % 7), np.float32)


def gathered(i):
    return np.concatenate([np.full(C, r + 1 + i % 7, np.float32) for r in range(n)])


def read(results):
    return [np.asarray(F.wait_tensor(y)) for y in results]


def reset():
    for i, x in enumerate(xs):
        x[...] = me + 1 + i % 7


# name: (call, check of its result after one call from reset inputs, its one call)
cases = {
    "all_reduce_coalesced": (
        lambda: pycoll.all_reduce_coalesced(xs),
        lambda _: all(np.array_equal(x, sum_of(i)) for i, x in enumerate(xs)),
        "one all_reduce",
    ),
    "functional all_reduce_coalesced": (
        lambda: read(F.all_reduce_coalesced(xs, "sum")),
        lambda got: all(np.array_equal(y, sum_of(i)) for i, y in enumerate(got)),
        "one all_reduce",
    ),
    "one all_reduce": (
        lambda: pycoll.all_reduce(one),
        lambda _: np.array_equal(one, np.concatenate([sum_of(i) for i in range(K)])),
        None,
    ),
    "all_gather_coalesced": (
        lambda: pycoll.all_gather_coalesced(outs, xs),
        lambda _: all(
            np.array_equal(outs[r][i], np.full(C, r + 1 + i % 7, np.float32))
            for r in range(n)
            for i in range(K)
        ),
        "one all_gather_into_tensor",
    ),
    "all_gather_into_tensor_coalesced": (
        lambda: pycoll.all_gather_into_tensor_coalesced(gathered_outs, xs),
        lambda _: all(np.array_equal(y, gathered(i)) for i, y in enumerate(gathered_outs)),
        "one all_gather_into_tensor",
    ),
    "functional all_gather_into_tensor_coalesced": (
        lambda: read(F.all_gather_into_tensor_coalesced(xs)),
        lambda got: all(np.array_equal(y, gathered(i)) for i, y in enumerate(got)),
        "one all_gather_into_tensor",
    ),
    "one all_gather_into_tensor": (
        lambda: pycoll.all_gather_into_tensor(one_out, one),
        lambda _: np.array_equal(
            one_out.reshape(n, -1),
            np.stack(
                [
                    np.concatenate([np.full(C, r + 1 + i % 7, np.float32) for i in range(K)])
                    for r in range(n)
                ]
            ),  # fmt: skip
        ),
        None,
    ),
    "reduce_scatter_tensor_coalesced": (
        lambda: pycoll.reduce_scatter_tensor_coalesced(rs_outs, rs_in),
        lambda _: all(np.array_equal(y, sum_of(i)) for i, y in enumerate(rs_outs)),
        "one reduce_scatter_tensor",
    ),
    "functional reduce_scatter_tensor_coalesced": (
        lambda: read(F.reduce_scatter_tensor_coalesced(rs_in, "sum", [0] * K)),
        lambda got: all(np.array_equal(y, sum_of(i)) for i, y in enumerate(got)),
        "one reduce_scatter_tensor",
    ),
    "one reduce_scatter_tensor": (
        lambda: pycoll.reduce_scatter_tensor(rs_one_out, rs_one_in),
        # this rank's part: whole inputs me*K/n .. (me+1)*K/n, summed
        lambda _: np.array_equal(
            rs_one_out,
            np.concatenate([np.full(C * n, total + n * (i % 7), np.float32) for i in range(K)])[
                me * C * K : (me + 1) * C * K
            ],
        ),
        None,
    ),
}

for name, (call, check, _) in cases.items():
    reset()
    one[...] = np.concatenate(xs)
    got = call()
    if comm.allreduce(not check(got), MPI.LOR):  # every rank stops
        raise SystemExit(f"{name} gave a wrong result on some rank")
times = {name: [] for name in cases}
names = list(cases)
for r in range(rounds):
    k = r % len(names)
    for name in names[k:] + names[:k]:
        t = time_block(cases[name][0], 3, 1, comm)
        times[name].append(comm.allreduce(t, MPI.MAX))

if me == 0:
    print(f"{n} ranks, {K} arrays of 1 KiB, {rounds} rounds: median us per call, and median")
    print("of the per-round ratios to the one call of the total size it stands for")
    for name in names:
        ref = cases[name][2]
        ratio = ""
        if ref is not None:
            ratio = f"{np.median([a / b for a, b in zip(times[name], times[ref])]):8.2f}x {ref}"
        print(f"{name:45s} {np.median(times[name]) * 1e6:10.0f} {ratio}")
pycoll.destroy_process_group()
