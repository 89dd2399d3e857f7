"""pycoll's point-to-point calls and barrier against raw mpi4py's.

A pipeline stage sends its activations to the next stage and receives the
gradients back every micro-batch: a ping-pong between neighbours. Per size,
the sides, every result checked once on every rank before the timing:

- ``send/recv``: ``pycoll.send`` then ``pycoll.recv`` (rank 0; the other
  ranks the mirror image, in pairs 0-1, 2-3...);
- ``isend/irecv``: the same with ``pycoll.isend``/``irecv`` and their Works'
  ``wait()``, as the torch backend makes them;
- ``batch``: the same, each send and receive a ``batch_isend_irecv`` of one
  ``P2POp`` and its Work's ``wait()``;
- ``mpi4py``: ``comm.Send`` then ``comm.Recv`` on the same arrays, the floor
  a Python caller reaches;
- with ``torch`` as the third argument (run it in ``.venv-torch``):
  ``tensors``, ``pycoll.send``/``recv`` on torch CPU tensors over the same
  memory, ``dist``, torch's ``dist.send``/``dist.recv`` on them over the
  backend "pycoll" (pycoll.torch), and ``gloo``, the same over a gloo group of
  the same ranks;

and at the first size ``barrier`` against ``comm.Barrier``, and a
``stream``: a stage sending ``STREAM`` messages one way (rank 0 to rank 1...),
each call its own ``wait()``, where a receive mostly finds its message
arrived (figures per message). Then rounds, the
order rotated each round; a figure is the median over rounds of the slowest
rank's mean per round trip (per barrier), each ratio the median of the
per-round ratios to mpi4py's. Not part of pycoll:

    mpiexec -n 2 python docs/measurements/p2p.py [ROUNDS] [BYTES,...] [torch]

ROUNDS (7); BYTES, each message (default 8 and 65536). An even number of
ranks. With PYTHONPATH naming another checkout it measures that one:
alternate runs to compare two versions.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Dict, Tuple

import measuring
import numpy as np

import pycoll
from pycoll.bench.table import _repeat, against, rotated

MPI, comm, n, me = measuring.world()
ROUNDS, SIZES = measuring.rounds_and_sizes(7, "8,64K")
TENSORS = len(sys.argv) > 3 and sys.argv[3] == "torch"
if TENSORS:
    import torch.distributed as dist

    import pycoll.torch  # noqa: F401  (registers the backend "pycoll")

    dist.init_process_group("pycoll", init_method="mpi://")  # (on pycoll's default group)
    GLOO = dist.new_group(backend="gloo")
if n % 2:
    raise SystemExit("p2p.py: run it on an even number of ranks (pairs 0-1, 2-3...)")
peer = me ^ 1
first = me % 2 == 0  # sends first

# A side: its call, and a check that calls it and returns the number of
# elements of what it received that differ from what the peer sent.
Side = Tuple[Callable[[], None], Callable[[], int]]


def sides(k: int) -> Dict[str, Side]:
    mine = np.arange(k, dtype=np.float32) + 1000 * me
    theirs = np.arange(k, dtype=np.float32) + 1000 * peer
    got = np.zeros(k, np.float32)

    def ping_pong(
        send: Callable[[Any, int], Any], recv: Callable[[Any, int], Any], out: Any, into: Any
    ) -> Callable[[], None]:
        """``send(out, peer)`` then ``recv(into, peer)``, or the mirror image."""
        return measuring.ping_pong(send, recv, out, into, peer, first)

    def checked(call: Callable[[], None]) -> Side:
        def check() -> int:
            got[...] = -1
            call()
            return int((got != theirs).sum())

        return call, check

    def isend(x: Any, to: int) -> None:
        pycoll.isend(x, to).wait()

    def irecv(x: Any, source: int) -> None:
        pycoll.irecv(x, source).wait()

    def batched(op: Callable) -> Callable[[Any, int], None]:
        def call(x: Any, other: int) -> None:
            for work in pycoll.batch_isend_irecv([pycoll.P2POp(op, x, other)]):
                work.wait()

        return call

    made = {
        "send/recv": checked(ping_pong(pycoll.send, pycoll.recv, mine, got)),
        "isend/irecv": checked(ping_pong(isend, irecv, mine, got)),
        "batch": checked(ping_pong(batched(pycoll.isend), batched(pycoll.irecv), mine, got)),
    }
    if TENSORS:
        import torch

        # Tensors over the arrays' memory (got is what a check reads).
        out, into = torch.from_numpy(mine), torch.from_numpy(got)
        made["tensors"] = checked(ping_pong(pycoll.send, pycoll.recv, out, into))
        for name, group in (("dist", None), ("gloo", GLOO)):
            send = functools.partial(dist.send, group=group)
            recv = functools.partial(dist.recv, group=group)
            made[name] = checked(ping_pong(send, recv, out, into))
    made["mpi4py"] = checked(ping_pong(comm.Send, comm.Recv, mine, got))
    return made


STREAM = 16


def streams(k: int) -> Dict[str, Side]:
    """The sides of a one-way stream of ``STREAM`` messages: send/recv,
    isend/irecv with each Work's wait(), mpi4py's Send/Recv."""
    mine = np.arange(k, dtype=np.float32) + 1000 * me
    theirs = np.arange(k, dtype=np.float32) + 1000 * peer
    got = np.zeros(k, np.float32)

    def stream(send: Callable[[Any, int], Any], recv: Callable[[Any, int], Any]) -> Side:
        def call() -> None:
            if first:
                for _ in range(STREAM):
                    send(mine, peer)
            else:
                for _ in range(STREAM):
                    recv(got, peer)

        def check() -> int:
            got[...] = -1
            call()
            return 0 if first else int((got != theirs).sum())

        return call, check

    return {
        "send/recv": stream(pycoll.send, pycoll.recv),
        "isend/irecv": stream(
            lambda x, to: pycoll.isend(x, to).wait(), lambda x, src: pycoll.irecv(x, src).wait()
        ),
        "mpi4py": stream(comm.Send, comm.Recv),
    }


def report(label: str, times: Dict[str, list], wrong: int) -> None:
    if me == 0:
        print(f"{label:>16}  wrong {wrong}: " + against(times, "mpi4py"), flush=True)


def main() -> None:
    if me == 0:
        print(f"# point-to-point, {n} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print("# us per round trip (median of rounds); ratio to mpi4py's")
    for i, nbytes in enumerate(SIZES):
        made = sides(max(1, nbytes // 4))
        wrong = comm.allreduce(sum(check() for _, check in made.values()))
        reps = max(10, int(1e6 // max(nbytes, 64)))
        runs = {s: _repeat(call) for s, (call, _) in made.items()}
        times = {s: [t * 1e6 for t in v] for s, v in rotated(runs, reps, ROUNDS, comm).items()}
        report(f"{nbytes} B", times, wrong)
        if i == 0:
            runs = {"barrier": _repeat(pycoll.barrier), "mpi4py": _repeat(comm.Barrier)}
            times = {
                s: [t * 1e6 for t in v] for s, v in rotated(runs, 4 * reps, ROUNDS, comm).items()
            }
            report("barrier", times, 0)
            made = streams(max(1, nbytes // 4))
            wrong = comm.allreduce(sum(check() for _, check in made.values()))
            runs = {s: _repeat(call) for s, (call, _) in made.items()}
            times = {
                s: [t * 1e6 / STREAM for t in v]
                for s, v in rotated(runs, max(10, reps // STREAM), ROUNDS, comm).items()
            }
            report(f"stream {nbytes} B", times, wrong)
    if TENSORS:
        dist.destroy_process_group()
    pycoll.destroy_process_group()


main()
