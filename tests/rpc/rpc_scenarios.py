"""RPC jobs that go wrong on purpose, run under mpiexec by tests/rpc/test_rpc_jobs.py
(and, for distributed autograd, by tests/rpc/test_rpc_autograd_jobs.py).

Usage: mpiexec -n 4 python tests/rpc/rpc_scenarios.py SCENARIO

Every rank prints JSON lines saying what happened to it.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import sys
import time

from mpi4py import MPI

import pycoll.rpc as rpc
from pycoll import DistTimeoutError

STOPPED_RANK = 1


# The stopped peer's heartbeat: 2 s without a word, far below the calls' 60 s
# timeout. (0.2 s x 3 once named a live rank, starved for 0.6 s of the 2-core
# CI machine while the other CI worker ran, instead of the stopped one.)
HEARTBEAT, MISSES = 0.5, 4


def report(rank: int, **facts: object) -> None:
    print(json.dumps({"rank": rank, **facts}), flush=True)


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_stopped(pid: int) -> None:
    """Until process ``pid`` has stopped itself (SIGSTOP), at most 30 s."""
    deadline = time.monotonic() + 30
    while state(pid) != "T":
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.01)


def stopped_peer(rank: int) -> None:
    """Rank 1 stops (SIGSTOP); rank 0's call to it fails by the heartbeat,
    naming it, long before the call's own 60 s timeout; rank 0 then resumes
    it and everyone shuts down cleanly."""
    options = rpc.RpcBackendOptions(heartbeat=HEARTBEAT, heartbeat_misses=MISSES)
    rpc.init_rpc(f"worker{rank}", rpc_backend_options=options)
    pids = MPI.COMM_WORLD.allgather(os.getpid())
    if rank == STOPPED_RANK:
        os.kill(os.getpid(), signal.SIGSTOP)  # resumed by rank 0
        report(rank, resumed=True)
    elif rank == 0:
        wait_stopped(pids[STOPPED_RANK])
        start = time.monotonic()
        try:
            rpc.rpc_sync(STOPPED_RANK, operator.add, args=(1, 2), timeout=60)
        except DistTimeoutError as exc:
            report(rank, error=str(exc), ranks=exc.ranks, seconds=time.monotonic() - start)
        else:
            report(rank, error=None)
        os.kill(pids[STOPPED_RANK], signal.SIGCONT)
    else:
        report(rank, value=rpc.rpc_sync(0, operator.add, args=(rank, 1)))
    rpc.shutdown()
    report(rank, shutdown=True)


def absent(rank: int) -> None:
    """Rank 3 comes to shutdown 8 s late; the others' 2 s shutdown names it,
    and they end without finalizing MPI (which would wait for it)."""
    rpc.init_rpc(f"worker{rank}")
    report(rank, value=rpc.rpc_sync((rank + 1) % 4, operator.add, args=(rank, 1)))
    if rank == 3:
        time.sleep(8)  # the straggler this scenario is about
    start = time.monotonic()
    try:
        rpc.shutdown(timeout=2)
    except DistTimeoutError as exc:
        report(rank, error=str(exc), ranks=exc.ranks, seconds=time.monotonic() - start)
    else:
        report(rank, error=None)


def at_exit(rank: int) -> None:
    """No shutdown call: the agent shuts down gracefully at exit, after the
    calls still in flight, and the job ends cleanly."""
    rpc.init_rpc(f"worker{rank}")
    futures = [rpc.rpc_async((rank + i) % 4, operator.mul, args=(rank, i)) for i in range(100)]
    report(rank, made=len(futures))


def stage(mode_route, x):
    """Distributed autograd's scenario: tanh here, then on along the route."""
    import torch

    y = torch.tanh(x * 2)
    return rpc.rpc_sync(mode_route[0], stage, args=(mode_route[1:], y)) if mode_route else y


def backward_stopped(rank: int) -> None:
    """Rank 0's forward pass goes 0 -> 1 -> 2; rank 2 then stops (SIGSTOP).
    Rank 0's backward reaches rank 1, whose call to rank 2 fails by the
    heartbeat: rank 0's backward raises naming rank 2, long before the 60 s
    RPC timeout; rank 0 resumes rank 2 and everyone shuts down cleanly."""
    import torch

    import pycoll.rpc.autograd as dist_autograd

    options = rpc.RpcBackendOptions(heartbeat=HEARTBEAT, heartbeat_misses=MISSES)
    rpc.init_rpc(f"worker{rank}", rpc_backend_options=options)
    pids = MPI.COMM_WORLD.allgather(os.getpid())
    stopped = 2
    if rank == 0:
        with dist_autograd.context() as context_id:
            x = torch.ones(4, requires_grad=True)
            loss = rpc.rpc_sync(1, stage, args=([stopped], x)).sum()
            MPI.COMM_WORLD.Barrier()  # the forward pass is done: rank 2 may stop
            wait_stopped(pids[stopped])
            start = time.monotonic()
            try:
                dist_autograd.backward(context_id, [loss])
            except RuntimeError as exc:
                report(rank, error=str(exc), seconds=time.monotonic() - start)
            else:
                report(rank, error=None)
            os.kill(pids[stopped], signal.SIGCONT)
    else:
        MPI.COMM_WORLD.Barrier()
        if rank == stopped:
            os.kill(os.getpid(), signal.SIGSTOP)  # resumed by rank 0
            report(rank, resumed=True)
    rpc.shutdown()
    report(rank, shutdown=True)


if __name__ == "__main__":
    scenario = sys.argv[1]
    {
        "stopped": stopped_peer,
        "absent": absent,
        "exit": at_exit,
        "backward_stopped": backward_stopped,
    }[scenario](MPI.COMM_WORLD.Get_rank())
