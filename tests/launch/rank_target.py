"""What the launcher tests run on each rank: ``rank_target.py MODE [args]``.

Every rank first prints one JSON line with what it sees (MPI's rank and
size, the variables pycoll-run set, its pid), so a test can check each rank
and later check that its process is gone. Then, by MODE:

- ``ok``: an all-reduce across the job, then exit 0;
- ``raise R``: rank R raises ValueError; the others wait in a barrier;
- ``exit R CODE``: rank R exits with CODE; the others wait in a barrier;
- ``hang R``: rank R sleeps in ``stuck_here``; the others wait in a barrier;
- ``kill R``: rank R kills itself with SIGKILL; the others wait in a barrier;
- ``spam LINES WIDTH``: every rank writes LINES long lines at once, each
  ``<rank>:<i>:`` then WIDTH copies of the rank's digit, in small pieces.
"""

import json
import os
import signal
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
    if mode == "spam":
        lines, width = int(argv[1]), int(argv[2])
        digit = str(world.Get_rank() % 10)
        for i in range(lines):
            line = f"{world.Get_rank()}:{i}:" + digit * width + "\n"
            for start in range(0, len(line), 1000):  # a line in several writes
                sys.stdout.write(line[start : start + 1000])
                sys.stdout.flush()
        return
    target = int(argv[1])
    if world.Get_rank() == target:
        if mode == "raise":
            raise ValueError(f"rank {target} refuses")
        if mode == "exit":
            sys.exit(int(argv[2]))
        if mode == "hang":
            stuck_here()
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    world.Barrier()


if __name__ == "__main__":
    main(sys.argv[1:])
