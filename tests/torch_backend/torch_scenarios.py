"""Jobs the torch backend's own-job tests start (tests/torch_backend/test_torch_jobs.py).

Run as ``mpiexec -n 2 python torch_scenarios.py SCENARIO``; each rank prints
one JSON line that the test reads.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def report(**fields) -> None:
    print(
        json.dumps(
            dict(
                fields,
                rank=int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1"))),
            )
        ),
        flush=True,
    )


def all_reduce_once(**init) -> None:
    dist.init_process_group("pycoll", **init)
    t = torch.full((3,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    g = dist.new_group(backend="gloo")  # torch's store works beside pycoll
    u = torch.ones(1)
    dist.all_reduce(u, group=g)
    report(
        rank_seen=dist.get_rank(),
        size=dist.get_world_size(),
        sum=t.tolist(),
        gloo=u.item(),
        backend=dist.get_backend(),
    )
    dist.destroy_process_group()


def main(scenario: str) -> None:
    if scenario == "mpi_url":
        all_reduce_once(init_method="mpi://")
    elif scenario == "plain":  # env:// (torch's default) with no variables set
        all_reduce_once()
    elif scenario in ("half_env", "half_env_wrong"):  # RANK and WORLD_SIZE alone, as many scripts
        os.environ["RANK"] = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", ""))
        os.environ["WORLD_SIZE"] = "2" if scenario == "half_env" else "3"
        try:
            all_reduce_once()
        except ValueError as exc:
            report(error=str(exc))
    elif scenario == "debug_lent":  # TORCH_DISTRIBUTED_DEBUG is lent to pycoll's start only
        import pycoll

        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.init_process_group("pycoll", init_method="mpi://")
        level = pycoll.get_debug_level().name
        dist.destroy_process_group()
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "OFF"
        dist.init_process_group("pycoll", init_method="mpi://")
        report(first=level, then=pycoll.get_debug_level().name, env=os.environ.get("PYCOLL_DEBUG"))
        dist.destroy_process_group()
    elif scenario == "mismatch_at_destroy":  # found by the call check at destroy: torch goes on
        dist.init_process_group("pycoll", init_method="mpi://")
        y = torch.ones(4, dtype=torch.int32 if dist.get_rank() == 1 else torch.float32)
        dist.all_reduce(y)  # one size, two dtypes: MPI runs it without a word
        dist.destroy_process_group()
        all_reduce_once(init_method="mpi://")  # torch's state was torn down whole
    elif scenario == "wrong_rank":
        try:
            dist.init_process_group("pycoll", init_method="mpi://", rank=5, world_size=9)
        except ValueError as exc:
            report(error=str(exc))
    elif scenario == "timeout":
        dist.init_process_group("pycoll", init_method="mpi://")
        from mpi4py import MPI

        t = torch.ones(2)
        if dist.get_rank() == 0:
            try:
                if os.environ.get("VIA_FUTURE"):  # the future must end too, not hang
                    dist.all_reduce(t, async_op=True).get_future().wait()
                else:
                    dist.all_reduce(t)  # rank 1 never calls it
            except Exception as exc:
                report(
                    kind=[c.__name__ for c in type(exc).__mro__],
                    error=str(exc),
                    is_torch=isinstance(exc, dist.DistBackendError),
                )
            MPI.COMM_WORLD.send("done", dest=1)
        else:
            MPI.COMM_WORLD.recv(source=0)  # alive, outside pycoll, until rank 0 is done
            report(skipped=True)
        os._exit(0)  # the group is broken; leave without its teardown
    elif scenario == "mismatch":
        dist.init_process_group("pycoll", init_method="mpi://")
        t = torch.ones(2 + dist.get_rank())  # a different shape on each rank
        try:
            dist.all_reduce(t)
        except Exception as exc:
            report(
                kind=[c.__name__ for c in type(exc).__mro__],
                error=str(exc),
                is_torch=isinstance(exc, dist.DistBackendError),
            )
        os._exit(0)
    else:
        raise SystemExit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    main(sys.argv[1])
