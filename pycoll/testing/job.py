"""Run some tests of this session as a fresh MPI job and collect what each
rank reported.

Each rank runs pytest on the given node ids in worker mode (``--mpi-worker
DIR``): it writes a line when a test starts and every test report, serialised
by pytest itself, to ``DIR/rank<N>.jsonl`` as it goes, so what happened before
a crash survives it. The job runs under pycoll-run's supervisor, which gives a
crashed rank's exit status and signal, ends the job when a rank dies, and on
timeout collects every rank's Python stack before killing it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

from pycoll.launch.cli import rank_program
from pycoll.launch.families import Family, Job, choose
from pycoll.launch.hosts import Host, HostError, parse_host_list
from pycoll.launch.supervisor import Options, Supervisor


@dataclass
class JobResult:
    status: int  # the supervisor's exit status
    timed_out: bool
    exits: Dict[int, Optional[int]]  # rank -> raw exit code (negative: the signal)
    hosts: Dict[int, str]
    records: Dict[int, List[Dict[str, Any]]]  # rank -> its records, in order
    first_failure: Optional[Tuple[int, int]]  # (rank, raw exit code) that ended the job
    output: List[Tuple[Optional[int], str]] = field(default_factory=list)


_FAMILY: Optional[Tuple[Family, str, str]] = None


def _family() -> Tuple[Family, str, str]:
    global _FAMILY
    if _FAMILY is None:
        _FAMILY = choose(os.environ.get("PYCOLL_TEST_LAUNCHER") or None, os.environ)
    return _FAMILY


class Progress:
    """Follows the ranks' record files while the job runs, to give each test its
    own deadline: from when the first rank starts it, its timeout; before the
    first test and between tests, ``allowance`` (start-up, collection)."""

    def __init__(self, results: Path, ranks: int, timeouts: Dict[str, float], allowance: float):
        self.paths = [results / f"rank{r}.jsonl" for r in range(ranks)]
        self.offsets = [0] * ranks
        self.running: List[Optional[str]] = [None] * ranks
        self.timeouts = timeouts
        self.allowance = allowance
        self.since: Dict[str, float] = {}  # test -> when a rank was first seen in it
        self.idle_since = time.monotonic()

    def deadline(self) -> float:
        now = time.monotonic()
        for r, path in enumerate(self.paths):
            try:
                with open(path) as f:
                    f.seek(self.offsets[r])
                    chunk = f.read()
            except OSError:
                continue
            done = chunk.rfind("\n") + 1  # whole lines only
            self.offsets[r] += done
            for line in chunk[:done].splitlines():
                if line.startswith('{"start": '):
                    test = json.loads(line)["start"]
                    self.running[r] = test
                    self.since.setdefault(test, now)
                elif '"when": "teardown"' in line:
                    self.running[r] = None
                    self.idle_since = now
        limits = [self.since[t] + self.timeouts.get(t, self.allowance) for t in self.running if t]
        if limits:
            return min(limits)
        return self.idle_since + self.allowance


def host_names(text: str) -> List[str]:
    """The host names of ``--mpi-hosts`` (names only: each job's ranks are
    spread over them by ``spread``)."""
    try:
        hosts = parse_host_list(text)
    except HostError as exc:
        raise pytest.UsageError(str(exc).replace("--hosts", "--mpi-hosts")) from None
    if any(":" in item for item in text.split(",")):
        raise pytest.UsageError(
            f"--mpi-hosts {text!r}: give host names only (h1,h2): each job's ranks are "
            f"spread evenly over them"
        )
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise pytest.UsageError(f"--mpi-hosts {text!r}: a host is named twice")
    return names


def spread(names: Sequence[str], ranks: int) -> List[Host]:
    """``ranks`` ranks over the hosts ``names`` in even blocks, in order:
    4 over two hosts 2 and 2, 3 over two 2 and 1, 1 on the first only."""
    per = math.ceil(ranks / len(names))
    used = math.ceil(ranks / per)
    return [Host(name, per) for name in names[:used]]


def run(
    nodeids: Sequence[str],
    files: Sequence[str],
    ranks: int,
    timeouts: Dict[str, float],
    allowance: float,
    cwd: Path,
    pytest_args: Sequence[str],
    live: bool,
    hosts: Optional[str] = None,
) -> JobResult:
    """Run the tests ``nodeids`` (collected from ``files``) on ``ranks`` ranks
    from ``cwd``, each within its timeout (``timeouts``, by node id); across
    ``hosts`` (``--mpi-hosts``) where given.

    Across hosts the ranks' record files go in a directory under ``cwd``,
    which every host sees as it sees the checkout (/tmp is each host's own on
    a cluster), and the ranks reach this process at its host name."""
    family, launcher, srun_mpi = _family()
    placed = spread(host_names(hosts), ranks) if hosts else None
    if placed:
        results = Path(tempfile.mkdtemp(prefix=".pycoll-test-", dir=cwd))
    else:
        results = Path(tempfile.mkdtemp(prefix="pycoll-test-"))
    output: List[Tuple[Optional[int], str]] = []

    def sink(rank: Optional[int], stream: int, line: str) -> None:
        output.append((rank, line))
        if live:
            sys.stdout.write(line + "\n" if rank is None else f"[{rank}] {line}\n")
            sys.stdout.flush()

    # The node ids travel in a file: a file's worth of parametrized ids could
    # outgrow what a launcher passes on its command line. The ranks collect the
    # files and keep those ids.
    (results / "nodeids").write_text("\n".join(nodeids) + "\n")
    args = ["pytest", "-p", "no:cacheprovider", "--mpi-worker", str(results), *pytest_args]
    program = rank_program("module", [*args, *files])
    job = Job(nprocs=ranks, program=program, hosts=placed, srun_mpi=srun_mpi)
    progress = Progress(results, ranks, timeouts, allowance)
    options = Options(
        start_timeout=allowance,
        sink=sink,
        deadline=progress.deadline,
        advertise=socket.getfqdn() if placed else "127.0.0.1",
    )
    supervisor = Supervisor(family, launcher, job, options)
    here = os.getcwd()
    try:
        os.chdir(cwd)
        status = supervisor.run()
    finally:
        os.chdir(here)
    if supervisor.interrupted is not None:
        # Ctrl-C or a kill of this pytest: the supervisor held the signal only
        # to stop the job's ranks first. The session ends as it would have
        # without a job (KeyboardInterrupt for SIGINT, the default end for
        # SIGTERM), instead of going on to the next test in a fresh job.
        shutil.rmtree(results, ignore_errors=True)
        signal.raise_signal(supervisor.interrupted)
    records: Dict[int, List[Dict[str, Any]]] = {}
    for rank in range(ranks):
        path = results / f"rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            try:
                records.setdefault(rank, []).append(json.loads(line))
            except ValueError:
                pass  # a line cut short by the rank's crash
    shutil.rmtree(results, ignore_errors=True)
    return JobResult(
        status=status,
        timed_out=supervisor.timed_out,
        exits={r: s.exit_code for r, s in supervisor.ranks.items()},
        hosts={r: s.host for r, s in supervisor.ranks.items()},
        records=records,
        first_failure=supervisor.failure,
        output=output,
    )
