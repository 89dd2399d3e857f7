"""Timing shared by the benchmarks that compare variants round by round."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, List

import numpy as np


def slowest(seconds: float) -> float:
    """The largest of every rank's ``seconds`` (a collective on the default group)."""
    import pycoll

    x = np.array([seconds])
    pycoll.all_reduce(x, op=pycoll.ReduceOp.MAX)
    return float(x[0])


def timed(call: Callable[[], Any], iters: int) -> float:
    """The slowest rank's mean seconds per call of ``iters`` calls, started
    together after a barrier."""
    import pycoll

    pycoll.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return slowest((time.perf_counter() - t0) / iters)


def spread(values: List[float]) -> str:
    """``median (min-max)`` of per-round figures, as the round-by-round tables print them."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"
