"""Jobs for pycoll.trace's tests, run by tests/trace/test_trace_jobs.py.

Usage: (pycoll-run | mpiexec) -n 3 python tests/trace/trace_scenarios.py SCENARIO

- ``hang``: five all_reduces, then rank 2 stops calling (it sleeps) while the
  others wait in the sixth; something else ends the job (pycoll-run
  --timeout, or the others' own timeout).
- ``late``: twenty all_reduces, rank 1 sleeping 20 ms before each (traced
  with PYCOLL_TRACE by the launcher).
"""

from __future__ import annotations

import sys
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


if __name__ == "__main__":
    pycoll.init_process_group()
    {"hang": hang, "late": late}[sys.argv[1]](pycoll.get_rank())
