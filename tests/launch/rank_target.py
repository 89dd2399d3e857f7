"""What the launcher tests run on each rank: ``rank_target.py MODE [args]``.

Every rank first prints one JSON line with what it sees (MPI's rank and
size, the variables pycoll-run set, its pid), so a test can check each rank
and later check that its process is gone. Then, by MODE:

- ``ok``: an all-reduce across the job, then exit 0;
- ``raise R``: rank R raises ValueError; the others wait in a barrier;
- ``exit R CODE``: rank R exits with CODE; the others wait in a barrier;
- ``hang R``: rank R sleeps in ``stuck_here``; the others wait in a barrier.
"""

import json
import os
import sys
import time

from mpi4py import MPI

VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
    "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "PYCOLL_TEST_VALUE", "SLURM_STEP_ID",
)  # fmt: skip


def stuck_here() -> None:
    time.sleep(3600)


def main(argv):
    world = MPI.COMM_WORLD
    me = {"mpi_rank": world.Get_rank(), "mpi_size": world.Get_size(), "pid": os.getpid()}
    me.update({k: os.environ.get(k) for k in VARS})
    me["argv"] = argv
    print("REPORT " + json.dumps(me), flush=True)
    mode = argv[0]
    if mode == "ok":
        print(f"stderr line of {world.Get_rank()}", file=sys.stderr, flush=True)
        assert world.allreduce(1) == world.Get_size()
        return
    target = int(argv[1])
    if world.Get_rank() == target:
        if mode == "raise":
            raise ValueError(f"rank {target} refuses")
        if mode == "exit":
            sys.exit(int(argv[2]))
        if mode == "hang":
            stuck_here()
    world.Barrier()


if __name__ == "__main__":
    main(sys.argv[1:])
