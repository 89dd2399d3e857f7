"""What pycoll-run costs at start-up and exit, against the bare launcher.

    python -m pycoll.launch.bench [-n 4] [--repeat 10]

Times three ways of running the same tiny MPI program (initialise MPI, one
barrier, exit): the MPI launcher alone, pycoll-run with the program as a
command (``--``), and pycoll-run with it as a script (through boot). The runs
alternate, so a machine that slows down part-way hurts all three alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

from .families import Job, choose

PROGRAM = "from mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\n"


def main(argv: List[str] = sys.argv[1:]) -> int:
    p = argparse.ArgumentParser(prog="python -m pycoll.launch.bench", description=__doc__)
    p.add_argument("-n", type=int, default=4)
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args(argv)
    family, launcher, _ = choose(None, os.environ)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(PROGRAM)
    n = str(args.n)
    run = [sys.executable, "-m", "pycoll.launch", "-n", n]
    bare = family.command(launcher, Job(nprocs=args.n, program=[sys.executable, f.name]))
    ways: Dict[str, List[str]] = {
        f"{family.label} alone": bare,
        "pycoll-run -- python prog.py": run + ["--", sys.executable, f.name],
        "pycoll-run prog.py": run + [f.name],
    }
    times: Dict[str, List[float]] = {k: [] for k in ways}
    try:
        for i in range(args.repeat):
            order = list(ways) if i % 2 == 0 else list(reversed(ways))
            for name in order:
                start = time.perf_counter()
                subprocess.run(ways[name], check=True, capture_output=True)
                times[name].append(time.perf_counter() - start)
    finally:
        os.unlink(f.name)
    print(f"# start-up and exit of a {args.n}-rank job (MPI init, one barrier), {args.repeat} runs")
    print(f"{'way':36s} {'median s':>9s} {'min s':>7s}")
    for name, ts in times.items():
        print(f"{name:36s} {statistics.median(ts):9.3f} {min(ts):7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
