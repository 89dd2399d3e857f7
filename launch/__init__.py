"""pycoll-run: one front door for MPICH, Open MPI, Intel MPI and Slurm jobs.

This folder (launch/ at the top of the source tree) is installed as
pycoll.launch; import it by that name. It never imports mpi4py.MPI, and its
rank side (rank.py, boot.py, wire.py) imports nothing of pycoll.

It drives the MPI launcher that is installed (never replacing MPI's own
process management), gives every rank torch-style variables (RANK,
LOCAL_RANK, MASTER_ADDR...), tags output by rank, and ends the whole job
with a clear report when one rank fails or the job runs past its time.
Also writes and submits Slurm and PBS batch scripts (``pycoll-run batch``).

Layout: :mod:`.cli` (arguments), :mod:`.families` (every vendor flag),
:mod:`.hosts` (host lists, hostfiles, allocations), :mod:`.supervisor`
(pycoll-run's side of a running job), :mod:`.rank` and :mod:`.boot` (each
rank's side), :mod:`.batch` (batch scripts).
"""

from typing import List, Optional

__all__ = ["main"]


def main(argv: Optional[List[str]] = None) -> int:
    """Run pycoll-run with ``argv`` (default: the command line); return its exit status."""
    from .cli import main as cli_main  # imported late: the rank-side modules stay light

    return cli_main(argv)
