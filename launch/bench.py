"""What pycoll-run costs at start-up and exit, against the bare launcher.

    python -m pycoll.launch.bench [-n 4] [--repeat 10]

Times three ways of running the same tiny MPI program (initialise MPI, one
barrier, exit): the MPI launcher alone, pycoll-run with the program as a
command (``--``), and pycoll-run with it as a script (through boot). The runs
alternate, so a machine that slows down part-way hurts all three alike, and
what pycoll-run adds is read per round (its run minus the bare launcher's in
the same round): the median of those, and the spread of the middle half.

pycoll-run's modules are byte-compiled first, as pip does when it installs
a wheel: with PYTHONDONTWRITEBYTECODE set (as in some containers) and a
source checkout, every start would otherwise compile them again (10-15 ms).
"""

from __future__ import annotations

import argparse
import compileall
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
    here = os.path.dirname(os.path.abspath(__file__))
    compiled = compileall.compile_dir(here, maxlevels=0, quiet=2) and compileall.compile_file(
        os.path.join(os.path.dirname(here), "__init__.py"), quiet=2
    )
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
    if not compiled:
        print("# (pycoll-run's modules could not be byte-compiled: each start compiles them)")
    alone = times[next(iter(ways))]
    print(f"{'way':36s} {'median s':>9s} {'min s':>7s} {'added s':>8s} {'middle half':>13s}")
    for name, ts in times.items():
        added = ""
        if ts is not alone:
            q = statistics.quantiles([t - b for t, b in zip(ts, alone)], n=4)
            added = f"{q[1]:8.3f}  {q[0]:.3f}-{q[2]:.3f}"
        print(f"{name:36s} {statistics.median(ts):9.3f} {min(ts):7.3f} {added}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
