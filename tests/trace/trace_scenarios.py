"""Jobs for pycoll.trace's tests, run by tests/trace/test_trace_jobs.py.

Usage: (pycoll-run | mpiexec) -n 3 python tests/trace/trace_scenarios.py SCENARIO

- ``hang``: five all_reduces, then rank 2 stops calling (it sleeps) while the
  others wait in the sixth; something else ends the job (pycoll-run
  --timeout, or the others' own timeout).
- ``late``: twenty all_reduces, rank 1 sleeping 20 ms before each (traced
  with PYCOLL_TRACE by the launcher).
- ``absent``: every rank but rank 2 starts a timeline; each prints one JSON
  line saying how its start ended.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import numpy as np

import pycoll

STUCK_RANK = 2


def hang(rank: int) -> None:
    x = np.ones(4, np.float32)
    for _ in range(5):
        pycoll.all_reduce(x)
    if rank == STUCK_RANK:
        time.sleep(600)  # the rank that does not arrive: this job is about it
    pycoll.all_reduce(x)


def late(rank: int) -> None:
    x = np.ones(16, np.float32)
    for _ in range(20):
        if rank == 1:
            time.sleep(0.02)  # the lateness the summary must find
        pycoll.all_reduce(x)
    pycoll.destroy_process_group()


def absent(rank: int) -> None:
    if rank == STUCK_RANK:
        time.sleep(600)  # never starts: the others' start must give up, not hang
    begun = time.monotonic()
    try:
        pycoll.trace.start(tempfile.mkdtemp())
    except pycoll.DistTimeoutError as exc:
        print(json.dumps({"rank": rank, "error": str(exc), "seconds": time.monotonic() - begun}))
        sys.stdout.flush()
        raise  # uncaught, it ends the job (rank 2 would keep MPI_Finalize waiting)
    print(json.dumps({"rank": rank, "error": None}), flush=True)


if __name__ == "__main__":
    pycoll.init_process_group()
    {"hang": hang, "late": late, "absent": absent}[sys.argv[1]](pycoll.get_rank())
