"""Jobs that hang on purpose, run by tests/test_hangs.py under mpiexec.

Usage: mpiexec -n 4 python tests/hang_scenarios.py SCENARIO [destroy]

Every rank prints one JSON line saying what happened to it, so the test can
check the diagnosis on every surviving rank. With ``destroy``, every rank
then calls destroy_process_group and prints a second line once it returned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import numpy as np

import pycoll
from pycoll import CollectiveMismatchError, DistTimeoutError

TIMEOUT = timedelta(seconds=1.5)
SELF_ROOT_CALLS = 300  # past 2 x the call check's EVERY (128)


def report(rank: int, **facts: object) -> None:
    print(json.dumps({"rank": rank, **facts}), flush=True)


def attempt(rank: int, call) -> None:
    """Run ``call`` and report how it ended."""
    start = time.monotonic()
    try:
        call()
    except (DistTimeoutError, CollectiveMismatchError) as exc:
        report(
            rank,
            error=type(exc).__name__,
            ranks=getattr(exc, "ranks", None),
            calls=sorted(getattr(exc, "calls", {}) or {}),
            message=str(exc),
            seconds=time.monotonic() - start,
        )
    else:
        report(rank, error=None, seconds=time.monotonic() - start)


def main(scenario: str, then: str = "") -> None:
    # PYCOLL_TIMEOUT, when the test sets it, is the default group's timeout.
    pycoll.init_process_group(**({} if "PYCOLL_TIMEOUT" in os.environ else {"timeout": TIMEOUT}))
    rank = pycoll.get_rank()
    x = np.ones(4, np.float32)
    pycoll.all_reduce(x)  # seq 1: everyone
    if scenario == "skip":
        if rank == 2:
            report(rank, skipped=True)
        else:
            attempt(rank, lambda: pycoll.all_reduce(x))  # seq 2, without rank 2
    elif scenario == "functional":  # rank 2 skips two functional all_reduces (seq 2, 3)
        from pycoll import functional as F

        if rank == 2:
            report(rank, skipped=True)
        else:
            y, z = F.all_reduce(x, "sum"), F.all_reduce(x, "sum")
            attempt(rank, lambda: F.wait_tensor(y))  # times out, naming rank 2
            start = time.monotonic()
            del y, z  # neither waits again: the group is broken
            report(rank, dropped=time.monotonic() - start)
    elif scenario == "order":
        first = pycoll.new_group([0, 1, 2], group_desc="first")
        second = pycoll.new_group([1, 2, 3], group_desc="second")
        # Rank 1 goes first then second, rank 2 second then first: a cycle.
        mine = {0: first, 1: first, 2: second, 3: second}[rank]
        attempt(rank, lambda: pycoll.all_reduce(x, group=mine))
    elif scenario == "sleep":
        if rank == 3:
            time.sleep(4 * TIMEOUT.total_seconds())
        attempt(rank, lambda: pycoll.all_reduce(x))
    elif scenario == "exit":
        if rank == 3:
            report(rank, exited=True)
            sys.exit(0)
        attempt(rank, lambda: pycoll.all_reduce(x))
    elif scenario == "stop":
        big = np.ones(1 << 21, np.float32)  # 8 MiB: every rank's progress is needed
        if rank == 3:  # stopped inside seq 2, until a helper resumes it 6 s later
            work = pycoll.all_reduce(big, async_op=True)
            subprocess.Popen(["sh", "-c", f"sleep 6; kill -CONT {os.getpid()}"])
            os.kill(os.getpid(), signal.SIGSTOP)
            attempt(rank, lambda: work.wait())
        else:
            attempt(rank, lambda: pycoll.all_reduce(big))
    elif scenario == "barrier":
        if rank == 1:
            attempt(rank, lambda: pycoll.barrier())
        else:
            attempt(rank, lambda: pycoll.all_reduce(x))
    elif scenario == "raise":
        if rank == 2:
            raise ValueError("rank 2 gives up")
        attempt(rank, lambda: pycoll.all_reduce(x))
    elif scenario == "shape":
        y = np.ones(3 if rank == 1 else 4, np.float32)
        attempt(rank, lambda: pycoll.all_reduce(y))
    elif scenario == "uncaught":  # rank 2 skips seq 2; the others do not catch the timeout
        if "STDERR_DIR" in os.environ:  # each rank's stderr apart: ranks print at once
            sys.stderr.flush()
            err = os.open(f"{os.environ['STDERR_DIR']}/{rank}", os.O_WRONLY | os.O_CREAT, 0o644)
            os.dup2(err, 2)
        if rank != 2:
            pycoll.all_reduce(x)
        report(rank, error=None)
    elif scenario == "dtype":  # MPI runs it without a word; then exit, no destroy
        y = np.ones(4, np.int32 if rank == 1 else np.float32)
        attempt(rank, lambda: pycoll.all_reduce(y))
    elif scenario == "self_root":  # every rank broadcasts as the root: no rank ever waits
        y = np.full(4, float(rank), np.float32)
        made = {"n": 0}

        def broadcasts() -> None:
            for made["n"] in range(1, SELF_ROOT_CALLS + 1):
                pycoll.broadcast(y, src=rank)

        attempt(rank, broadcasts)
        report(rank, made=made["n"])
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    if then == "destroy":
        start = time.monotonic()
        try:
            pycoll.destroy_process_group()
        except CollectiveMismatchError:  # said again once everything is freed: seen already
            pass
        report(rank, destroyed=True, seconds=time.monotonic() - start)


if __name__ == "__main__":
    main(*sys.argv[1:])
