"""torch's list forms (all_gather, reduce_scatter, gather, scatter) against
what a raw mpi4py program writes for them.

``pycoll.all_gather(outputs, x)`` fills a list of separate arrays, one per
rank. mpi4py has no list form: its program gathers into one stacked array
and copies each rank's part out (``raw + copy out``), the like-for-like
baseline; ``raw`` (the gather alone) and pycoll's ``all_gather_into_tensor``
into the stacked array are shown beside it. ``pycoll.reduce_scatter(out,
inputs)`` reduces a list of arrays, one per rank; the raw program stacks
them and reduce-scatters that (``raw stack + reduce-scatter``, the baseline
of ``pycoll reduce_scatter list``). ``gather`` and ``scatter`` (root 0)
against the same: a raw gather into one array and its parts copied out on
the root, and a raw scatter of the list stacked. Every case's result is checked once on
every rank; then rounds, the order rotated each round; a figure is the
median over rounds of the slowest rank's mean per call, and each ratio the
median of the per-round ratios to its baseline. Not part of pycoll:

    mpiexec -n 2 python docs/measurements/list_forms.py [ROUNDS] [BYTES,...]

ROUNDS (7); BYTES, each rank's input to the all-gather and output of the
reduce-scatter (default 8 B to 1 MiB).
"""

from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np
from measuring import rounds_and_sizes, world

import pycoll
from pycoll.bench.table import _repeat, rotated

MPI, comm, n, me = world()
F = MPI.FLOAT
ROUNDS, SIZES = rounds_and_sizes(7, "8,4K,64K,1M")


def cases(per: int) -> Dict[str, Callable[[], List[np.ndarray]]]:
    """Each case as a call that returns the rank's parts as it left them."""
    inp = np.arange(per, dtype=np.float32) + 1000 * me
    outs = [np.empty(per, np.float32) for _ in range(n)]
    stacked = np.empty(n * per, np.float32)
    parts = [stacked[r * per : (r + 1) * per] for r in range(n)]

    def list_form() -> List[np.ndarray]:
        pycoll.all_gather(outs, inp)
        return outs

    def tensor_form() -> List[np.ndarray]:
        pycoll.all_gather_into_tensor(stacked, inp)
        return parts

    def raw() -> List[np.ndarray]:
        comm.Allgather([inp, F], [stacked, F])
        return parts

    def raw_split() -> List[np.ndarray]:
        comm.Allgather([inp, F], [stacked, F])
        for r in range(n):
            outs[r][...] = stacked[r * per : (r + 1) * per]
        return outs

    parts_in = [np.arange(per, dtype=np.float32) + 1000 * me + d for d in range(n)]
    out = np.empty(per, np.float32)

    def rs_list() -> List[np.ndarray]:
        pycoll.reduce_scatter(out, parts_in)
        return [out]

    def rs_raw() -> List[np.ndarray]:
        comm.Reduce_scatter_block([np.concatenate(parts_in), F], [out, F], MPI.SUM)
        return [out]

    mine = np.empty(per, np.float32)
    root_list = outs if me == 0 else None

    def gather() -> List[np.ndarray]:
        pycoll.gather(inp, root_list, dst=0)
        return outs if me == 0 else []

    def gather_raw() -> List[np.ndarray]:
        comm.Gather([inp, F], [stacked, F] if me == 0 else None, 0)
        if me == 0:
            for r in range(n):
                outs[r][...] = stacked[r * per : (r + 1) * per]
            return outs
        return []

    sources = [np.arange(per, dtype=np.float32) + 1000 * r for r in range(n)]

    def scatter() -> List[np.ndarray]:
        pycoll.scatter(mine, sources if me == 0 else None, src=0)
        return [mine]

    def scatter_raw() -> List[np.ndarray]:
        comm.Scatter([np.stack(sources), F] if me == 0 else None, [mine, F], 0)
        return [mine]

    return {
        "raw gather + copy out": gather_raw,
        "pycoll gather": gather,
        "raw stack + scatter": scatter_raw,
        "pycoll scatter": scatter,
        "raw + copy out": raw_split,
        "pycoll list": list_form,
        "raw": raw,
        "pycoll into tensor": tensor_form,
        "raw stack + reduce-scatter": rs_raw,
        "pycoll reduce_scatter list": rs_list,
    }


BASE = {
    "pycoll reduce_scatter list": "raw stack + reduce-scatter",
    "pycoll gather": "raw gather + copy out",
    "pycoll scatter": "raw stack + scatter",
    "raw gather + copy out": "raw gather + copy out",
    "raw stack + scatter": "raw stack + scatter",
    "raw stack + reduce-scatter": "raw stack + reduce-scatter",
}
RS = ("raw stack + reduce-scatter", "pycoll reduce_scatter list")
SCATTERS = ("raw stack + scatter", "pycoll scatter")


def main() -> None:
    if me == 0:
        print(f"# list forms, {n} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print("# us per call (median of rounds); ratio to raw + copy out (the reduce-scatter's")
        print("# to raw stack + reduce-scatter)")
    for nbytes in SIZES:
        per = max(1, nbytes // 4)
        made = cases(per)
        want = [np.arange(per, dtype=np.float32) + 1000 * r for r in range(n)]
        summed = [sum(np.arange(per, dtype=np.float32) + 1000 * r + me for r in range(n))]
        wrong = 0
        for k, f in made.items():
            wanted = summed if k in RS else [want[me]] if k in SCATTERS else want
            wrong += sum(int((got != w).sum()) for got, w in zip(f(), wanted))
        wrong = comm.allreduce(wrong)
        reps = max(10, int(2e7 // max(nbytes * n, 64)))
        runs = {k: _repeat(f) for k, f in made.items()}
        times = {k: [t * 1e6 for t in v] for k, v in rotated(runs, reps, ROUNDS, comm).items()}
        if me == 0:
            cells = [
                f"{k} {np.median(v):.1f} "
                f"({np.median(np.array(v) / np.array(times[BASE.get(k, 'raw + copy out')])):.2f})"
                for k, v in times.items()
            ]
            print(f"{per * 4:>9} B  wrong {wrong}: " + "; ".join(cells), flush=True)
    pycoll.destroy_process_group()


main()
