"""MPI's all-to-all in its two forms, as every rank of a call must choose alike.

MPI takes ``MPI_IN_PLACE`` only where every rank of a call passes it, so
pycoll's all_to_all_single makes one form on every rank whatever each rank's
call is (pycoll.collectives.alltoall._in_place). What each form costs the
callers it does not match:

- ``out of place``: MPI's out-of-place call (what an out-of-place caller
  costs where every rank goes out of place);
- ``in place + copy``: the input copied into the output, then MPI's in-place
  call (what an out-of-place caller costs where every rank goes in place);
- ``copy aside + out of place``: the input copied into a buffer kept across
  calls, then MPI's out-of-place call into the input (what an in-place caller
  costs where every rank goes out of place);
- ``in place``: MPI's in-place call alone;
- ``v-form, out of place`` and ``v-form, in place``: ``MPI_Ialltoallv`` with
  this rank's own part left out on both sides (its counts 0), the output's
  own part copied from the input by the caller, or, in place, only the parts
  sent copied aside (pycoll's form from 128 KiB);
- ``v-form, in place, whole copy``: the same with the whole input copied
  aside (pycoll's compiled path before it skipped the own part);
- ``v-form, in place, received aside``: the v-form sent from the caller's
  array and received into a kept buffer, the parts received then copied
  into place (measured, not pycoll's);
- on 2 ranks, ``exchange, out of place`` and ``exchange, in place``: one
  ``Isendrecv`` (``Sendrecv`` blocking) with the other rank, this rank's own
  part copied into the output, or, in place, the part sent copied aside
  first (measured, not pycoll's).

Each form nonblocking (``MPI_Ialltoall`` then a wait: pycoll's default mode)
and blocking (``PYCOLL_WAIT=blocking``), and the persistent requests of
pycoll's plans (``MPI_Alltoall_init`` out of place and in place, started and
waited for). Every form's result is checked once on every rank; then rounds,
the order rotated each round; a figure is the median over rounds of the
slowest rank's mean per call, and each ratio the median of the per-round
ratios to the nonblocking out-of-place call. Not part of pycoll:

    mpiexec -n 2 python docs/measurements/all_to_all_forms.py [ROUNDS] [BYTES,...]

ROUNDS (7); BYTES, the whole input of a rank (default 16 B to 32 MiB).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Tuple

import numpy as np
from mpi4py import MPI

from pycoll.bench.table import _repeat, against, rotated

comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
F = MPI.FLOAT
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
SIZES = (
    [int(b) for b in sys.argv[2].split(",")]
    if len(sys.argv) > 2
    else [16, 256, 4096, 16384, 65536, 131072, 1 << 20, 8 << 20, 32 << 20]
)


def source(count: int) -> np.ndarray:
    """This rank's input: part d, for rank d, tagged with both ranks."""
    per = count // n
    return np.concatenate([np.arange(per, dtype=np.float32) + 1000 * me + 100000 * d
                           for d in range(n)])  # fmt: skip


def wanted(count: int) -> np.ndarray:
    per = count // n
    return np.concatenate([np.arange(per, dtype=np.float32) + 1000 * s + 100000 * me
                           for s in range(n)])  # fmt: skip


def forms(
    count: int,
) -> Tuple[Dict[str, Callable[[], np.ndarray]], Tuple[Any, Any], Callable[[], None]]:
    """Each form as a call that leaves the result in the array it returns;
    the two persistent requests (to free); and what puts the in-place forms'
    input back (each call of theirs leaves the result in it)."""
    inp = source(count)
    out = np.empty_like(inp)
    buf = inp.copy()  # the in-place caller's array
    aside = np.empty_like(inp)
    plan_send, plan_recv, plan_buf = inp.copy(), np.empty_like(inp), inp.copy()
    plans = (
        comm.Alltoall_init([plan_send, F], [plan_recv, F]),
        comm.Alltoall_init(MPI.IN_PLACE, [plan_buf, F]),
    )

    def reset() -> None:
        buf[...] = inp
        plan_buf[...] = inp

    def run(name: str, nonblocking: bool) -> Callable[[], np.ndarray]:
        def call(send: object, recv: np.ndarray) -> None:
            if nonblocking:
                comm.Ialltoall(send, [recv, F]).Wait()
            else:
                comm.Alltoall(send, [recv, F])

        if name == "out of place":
            return lambda: (call([inp, F], out), out)[1]
        if name == "in place + copy":
            return lambda: (np.copyto(out, inp), call(MPI.IN_PLACE, out), out)[2]
        if name == "copy aside + out of place":
            return lambda: (np.copyto(aside, buf), call([aside, F], buf), buf)[2]
        return lambda: (call(MPI.IN_PLACE, buf), buf)[1]  # in place

    made: Dict[str, Callable[[], np.ndarray]] = {}
    for name in ("out of place", "in place + copy", "copy aside + out of place", "in place"):
        made[f"I {name}"] = run(name, True)
        made[f"B {name}"] = run(name, False)
    per = count // n
    lo, hi = per * me, per * (me + 1)
    counts = [0 if r == me else per for r in range(n)]
    v = (counts, [per * r for r in range(n)])

    def v_out() -> np.ndarray:
        out[lo:hi] = inp[lo:hi]
        comm.Ialltoallv([inp, v, F], [out, v, F]).Wait()
        return out

    def v_in() -> np.ndarray:
        aside[:lo], aside[hi:] = buf[:lo], buf[hi:]
        comm.Ialltoallv([aside, v, F], [buf, v, F]).Wait()
        return buf

    def v_in_whole() -> np.ndarray:
        aside[...] = buf
        comm.Ialltoallv([aside, v, F], [buf, v, F]).Wait()
        return buf

    def v_in_received() -> np.ndarray:
        comm.Ialltoallv([buf, v, F], [aside, v, F]).Wait()
        buf[:lo], buf[hi:] = aside[:lo], aside[hi:]
        return buf

    if n == 2:  # the two-rank exchange: the other rank's part sent, its part received
        peer = 1 - me
        plo, phi = per * peer, per * (peer + 1)

        def exchange(send: np.ndarray, recv: np.ndarray, nonblocking: bool) -> None:
            if nonblocking:
                comm.Isendrecv([send, F], peer, 7, [recv, F], peer, 7).Wait()
            else:
                comm.Sendrecv([send, F], peer, 7, [recv, F], peer, 7)

        def exchanged(
            nonblocking: bool,
            into: np.ndarray,
            source: np.ndarray,
            send: np.ndarray,
            recv: np.ndarray,
            result: np.ndarray,
        ) -> Callable[[], np.ndarray]:
            """A call that copies ``source`` into ``into``, exchanges ``send``
            with the other rank into ``recv``, and returns ``result``."""

            def f() -> np.ndarray:
                into[...] = source
                exchange(send, recv, nonblocking)
                return result

            return f

        # Out of place this rank's own part copied into the output, in place
        # the part sent copied aside first: exchanged's arguments.
        exchanges = {
            "out of place": (out[lo:hi], inp[lo:hi], inp[plo:phi], out[plo:phi], out),
            "in place": (aside[plo:phi], buf[plo:phi], aside[plo:phi], buf[plo:phi], buf),
        }
        for b, name in ((True, "I"), (False, "B")):
            for form, views in exchanges.items():
                made[f"{name} exchange, {form}"] = exchanged(b, *views)
    made["I v-form, out of place"] = v_out
    made["I v-form, in place"] = v_in
    made["I v-form, in place, whole copy"] = v_in_whole
    made["I v-form, in place, received aside"] = v_in_received
    made["plan out of place"] = lambda: (plans[0].Start(), plans[0].Wait(), plan_recv)[2]
    made["plan in place"] = lambda: (plans[1].Start(), plans[1].Wait(), plan_buf)[2]
    return made, plans, reset


def main() -> None:
    if me == 0:
        print(f"# all-to-all forms, {n} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print("# us per call (median of rounds); ratio to the nonblocking out-of-place call")
    for nbytes in SIZES:
        count = nbytes // 4 // n * n
        made, plans, reset = forms(count)
        want = wanted(count)
        wrong = 0
        for f in made.values():
            reset()
            wrong += int((f() != want).sum())
        wrong = comm.allreduce(wrong)
        reps = max(3, min(2000, int(2e7 // max(count * 4, 64))))
        times = rotated({k: _repeat(f) for k, f in made.items()}, reps, ROUNDS, comm)
        if me == 0:
            line = against(times, "I out of place", 1e6, 1)
            print(f"{count * 4:>9} B  wrong {wrong}: {line}", flush=True)
        for p in plans:
            p.Free()


main()
