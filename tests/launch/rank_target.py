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
  ``<rank>:<i>:`` then WIDTH copies of the rank's digit, in small pieces;
- ``poke``: rank 0 connects to pycoll-run's port (read from its wrapper's
  environment) and sends lines that are not messages, then all do ``ok``;
- ``wait PATH``: every rank waits (at most 120 s) until PATH exists, then
  all do ``ok``;
- ``scan``: every rank reports the command lines of this machine's processes
  that carry pycoll-run's token variable with a value.
"""

import json
import os
import signal
import socket
import sys
import time

from mpi4py import MPI

VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
    "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "PYCOLL_TEST_VALUE", "SLURM_STEP_ID",
)  # fmt: skip


def stuck_here() -> None:
    time.sleep(3600)


def poke() -> None:
    environ = open(f"/proc/{os.getppid()}/environ", "rb").read().split(b"\0")
    addr = next(v for v in environ if v.startswith(b"PYCOLL_RUN_ADDR=")).split(b"=", 1)[1]
    host, _, port = addr.decode().rpartition(":")
    guess = b"pycoll-run 0123\n" + b"\x00\x00\x00\x01N"  # a wrong token, then a frame
    for junk in (b"not a message at all\n", b"[1, 2]\n", guess):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(junk)
            sock.recv(1)  # pycoll-run closes it: it is not one of the job's ranks


def token_on_a_command_line() -> list:
    found = []
    for pid in os.listdir("/proc"):
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        for i, arg in enumerate(args):
            if arg.startswith(b"PYCOLL_RUN_TOKEN=") or (
                arg == b"PYCOLL_RUN_TOKEN" and i > 0 and args[i - 1] == b"-genv"
            ):
                found.append(b" ".join(args).decode(errors="replace")[:200])
    return found


def main(argv):
    world = MPI.COMM_WORLD
    me = {"mpi_rank": world.Get_rank(), "mpi_size": world.Get_size(), "pid": os.getpid()}
    me.update({k: os.environ.get(k) for k in VARS})
    me["argv"] = argv
    print("REPORT " + json.dumps(me), flush=True)
    mode = argv[0]
    if mode == "poke":
        if world.Get_rank() == 0:
            poke()
        mode = "ok"
    if mode == "scan":
        print("SCAN " + json.dumps(token_on_a_command_line()), flush=True)
        world.Barrier()  # every rank's wrapper and the launcher still run while scanned
        return
    if mode == "wait":
        deadline = time.monotonic() + 120
        while not os.path.exists(argv[1]):
            assert time.monotonic() < deadline, f"{argv[1]} never appeared"
            time.sleep(0.05)
        mode = "ok"
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
    # Every rank has written its report before one of them fails (the
    # launcher then stops the others, and a line still on its way is lost).
    world.Barrier()
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
