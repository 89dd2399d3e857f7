"""How many threads a rank's parallel kernels may use.

Ranks on one node share its cores, so each rank's kernels get
``cores / ranks on this node`` threads (at least one), unless
``PYCOLL_NUM_THREADS`` says otherwise. numba's pool is per process and its
default (workqueue) layer must not be entered by two threads at once, so
parallel kernels run one at a time under a process-wide lock.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, FrozenSet, Optional

from ..groups import STATE

__all__ = ["per_rank", "count", "run", "LOCK", "PARALLEL_BYTES"]

LOCK = threading.Lock()
# Local work at least this large uses the parallel kernels (when a rank has
# more than one thread): below it, waking the pool costs more than it saves.
PARALLEL_BYTES = 1 << 20
_COUNT: Optional[int] = None
_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def cpus() -> FrozenSet[int]:
    """The CPUs this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return frozenset(range(os.cpu_count() or 1))


def cores() -> int:
    """How many cores this process may run on."""
    return len(cpus())


def _ranks_here() -> int:
    if STATE.local_size:
        return STATE.local_size
    for name in _VARS:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def per_rank(ranks_here: Optional[int] = None) -> int:
    """Threads for this rank: PYCOLL_NUM_THREADS, else cores / ranks on the node."""
    text = os.environ.get("PYCOLL_NUM_THREADS", "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(
                f"PYCOLL_NUM_THREADS={text!r} is not a positive integer; "
                f"set it to the number of threads each rank's kernels may use"
            )
        return int(text)
    return max(1, cores() // (ranks_here or _ranks_here()))


def count() -> int:
    """:func:`per_rank`, worked out once per process."""
    global _COUNT
    if _COUNT is None:
        _COUNT = per_rank()
    return _COUNT


def run(kernel_for: Callable[[bool], Callable], nbytes: int, *args: Any) -> None:
    """Run ``kernel_for(parallel)(*args)``: the parallel build for large work
    when this rank has threads to spare, the serial one otherwise."""
    n = count()
    if n > 1 and nbytes >= PARALLEL_BYTES:
        import numba

        with LOCK:
            if numba.get_num_threads() != n:
                numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
            kernel_for(True)(*args)
    else:
        kernel_for(False)(*args)
