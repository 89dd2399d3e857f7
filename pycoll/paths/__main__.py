"""``python -m pycoll.paths COLLECTIVE DTYPE SIZE --ranks N``: which path a
call would take, and why (pycoll.paths.explain).

It asks the deciders as a group of N ranks would, with the MPI this Python
loads, the tuning ``PYCOLL_TUNING`` sets and the wait mode ``PYCOLL_WAIT``
sets; ``--nodes`` says whether the ranks share one node (the shared window
needs it). Nothing is sent: no job is needed. Example::

    $ python -m pycoll.paths all_reduce float32 16MiB --ranks 4
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import numpy as np

from .. import _mpi, watch
from ..arrays import SUPPORTED_DTYPES
from ..bench import parse_size
from ..collectives import reduce  # noqa: F401 (its paths register themselves)
from ..ops import plan
from ..reduceop import MEMBERS
from . import Call, explain, rule

_DTYPES = {str(d): d for d in SUPPORTED_DTYPES}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pycoll.paths",
        description="Which path a reduction would take on a group of N ranks, and why.",
    )
    p.add_argument("collective", choices=sorted(rule.ORDER))
    p.add_argument("dtype", choices=sorted(_DTYPES), metavar="DTYPE", help="e.g. float32")
    p.add_argument("size", type=parse_size, help="its bytes (an input's), e.g. 16MiB, 256K")
    p.add_argument("--ranks", type=int, required=True, help="the group's size")
    p.add_argument("--op", default="SUM", type=str.upper, help="the ReduceOp (default SUM)")
    p.add_argument("--nodes", type=int, default=1, help="nodes the ranks are on (default 1)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.ranks < 1 or args.nodes < 1 or args.nodes > args.ranks:
        print(
            f"--ranks must be 1 or more and --nodes between 1 and the ranks; got "
            f"--ranks {args.ranks} --nodes {args.nodes}",
            file=sys.stderr,
        )
        return 2
    if args.op not in MEMBERS:  # (PREMUL_SUM needs its factor: its paths are SUM's)
        ops = ", ".join(MEMBERS)
        print(f"--op {args.op}: not a ReduceOp this tool takes; one of {ops}", file=sys.stderr)
        return 2
    _mpi.load()
    watch.set_wait_mode_from_env()
    dtype = np.dtype(_DTYPES[args.dtype])
    try:
        how = plan(MEMBERS[args.op], dtype, args.collective)
    except (TypeError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    call = Call(args.collective, args.op, dtype, args.size, args.ranks, how)
    print(explain(call, one_node=args.nodes == 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
