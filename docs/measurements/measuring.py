"""What several of the measurement programs here share: their start (pycoll's
default group, MPI's world, the ROUNDS and BYTES arguments), the round trip
between neighbouring ranks that p2p.py and backend_calls.py time, and the
table of median times and ratios that rs_in_place.py, rs_pairwise.py and
fused_window.py print. A program imports it as its sibling (run as
``python docs/measurements/X.py``, the program's folder comes first on the
path). Importing it imports nothing of pycoll's (nor MPI): each function
imports what it needs. Not part of pycoll."""

import sys
from typing import Any, Callable, Dict, List, Tuple

import numpy as np


def world() -> Tuple[Any, Any, int, int]:
    """pycoll's default group made (MPI starts as pycoll starts it); MPI,
    its COMM_WORLD, the world's size and this rank."""
    import pycoll
    from pycoll import _mpi

    pycoll.init_process_group()
    MPI = _mpi.MPI
    comm = MPI.COMM_WORLD
    return MPI, comm, comm.size, comm.rank


def rounds_and_sizes(rounds: int, sizes: str) -> Tuple[int, List[int]]:
    """The program's first two arguments, or the defaults given: ROUNDS, and
    BYTES, sizes separated by commas (8, 64K, 16M: pycoll.bench.parse_size)."""
    from pycoll.bench import parse_size

    argv = sys.argv
    return (
        int(argv[1]) if len(argv) > 1 else rounds,
        [parse_size(s) for s in (argv[2] if len(argv) > 2 else sizes).split(",")],
    )


def ping_pong(
    send: Callable[[Any, int], Any],
    recv: Callable[[Any, int], Any],
    out: Any,
    into: Any,
    peer: int,
    first: bool,
) -> Callable[[], None]:
    """A round trip with ``peer``: ``send(out, peer)`` then ``recv(into,
    peer)`` where this rank goes ``first``, the mirror image where not."""

    def call() -> None:
        if first:
            send(out, peer)
            recv(into, peer)
        else:
            recv(into, peer)
            send(out, peer)

    return call


def print_medians(
    title: str,
    times: Dict[Tuple[Any, str], List[float]],
    rows: Dict[Any, str],
    names: List[str],
    base: str,
    scale: float,
    digits: int,
    width: int,
    base_over: bool = False,
) -> None:
    """The table of ``times`` (each round's seconds per call, by (row,
    name)): ``title``, the names, then per row its label (``rows``: the
    rows in order, each with its label) and each name's median times
    ``scale``, ``digits`` after the point, and under them the median over
    rounds of each name's time over ``base``'s in the same round
    (``base_over``: of ``base``'s over the name's); ``width`` a column."""
    pad = " " * len(next(iter(rows.values())))
    print(title)
    print(pad + "".join(f"{k:>{width}s}" for k in names))
    for row, label in rows.items():
        ref = times[(row, base)]
        figures = [times[(row, k)] for k in names]
        medians = "".join(f"{np.median(t) * scale:{width}.{digits}f}" for t in figures)
        ratios = "".join(
            f"{np.median([a / b if base_over else b / a for a, b in zip(ref, t)]):{width}.2f}"
            for t in figures
        )
        print(f"{label}{medians}\n{pad}{ratios}")
