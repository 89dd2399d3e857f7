"""The pytest plugin: multi-rank tests from a plain ``pytest``.

Three modes, chosen at start-up:

- **isolated** (plain ``pytest``): a test marked ``@pytest.mark.mpi(ranks=N)``
  runs as a fresh N-rank MPI job (with ``--mpi-reuse``, the marked tests of one
  file with the same rank count share one job); its ranks' reports come back and
  become one outcome. Unmarked tests run here, as usual.
- **in place** (``mpiexec -n N python -m pytest --with-mpi``, pytest-mpi's way):
  every rank runs the session; after each test phase the ranks exchange outcomes
  and rank 0 reports one outcome per test for all.
- **worker** (``--mpi-worker DIR``, internal): a rank of an isolated job, writing
  its reports for the controlling pytest to read.

With pytest-mpi installed beside it (and not disabled with ``-p no:pytest_mpi``),
``--with-mpi`` and the in-place mode are pytest-mpi's: this plugin adds neither
and runs only isolated jobs, whose workers run without pytest-mpi.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Dict, Generator, Iterator, List, Optional, Tuple

import pytest

from pycoll.launch.supervisor import describe_exit

from .. import _mpi  # (imports no MPI: _mpi.load starts it, in a rank)
from . import job as job_mod
from .merge import combine, labelled, prefixed

DEFAULT_RANKS = 2
DEFAULT_TIMEOUT_S = 300.0  # never infinite: a deadlock must end
START_ALLOWANCE_S = 60.0  # for a job's start-up and collection, and between its tests
PHASES = ("setup", "call", "teardown")


PYTEST_MPI = "pytest_mpi"  # pytest-mpi's plugin name (its pytest11 entry point)


def _pytest_mpi_active(pluginmanager: Any) -> bool:
    """Whether pytest-mpi's plugin is installed and not blocked (``-p no:pytest_mpi``).

    Asked when options are added, before every installed plugin is loaded, so
    it looks at the installed entry points rather than at loaded plugins."""
    if pluginmanager.is_blocked(PYTEST_MPI) or os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return pluginmanager.has_plugin(PYTEST_MPI)
    from importlib.metadata import entry_points

    return any(ep.name == PYTEST_MPI for ep in entry_points(group="pytest11"))


def pytest_addoption(parser: pytest.Parser, pluginmanager: Any) -> None:
    group = parser.getgroup("mpi", "multi-rank tests (pycoll.testing)")
    if not _pytest_mpi_active(pluginmanager):  # else --with-mpi is pytest-mpi's
        group.addoption(
            "--with-mpi",
            action="store_true",
            help="run in place on the ranks of the MPI job this pytest is part of "
            "(mpiexec -n N python -m pytest --with-mpi); rank 0 reports for all",
        )
    group.addoption(
        "--mpi-reuse",
        action="store_true",
        help="let marked tests of one file with the same rank count share a job "
        "(faster; one test's crash or hang then ends the rest of that job)",
    )
    group.addoption(
        "--mpi-reuse-all",
        action="store_true",
        help="let all marked tests with the same rank count share one job, across files "
        "(one start-up for a whole suite; a crash or hang ends the rest of it)",
    )
    group.addoption(
        "--mpi-timeout",
        type=float,
        metavar="SECONDS",
        help=f"timeout of a marked test without its own (default {DEFAULT_TIMEOUT_S:g})",
    )
    group.addoption(
        "--mpi-oversubscribe",
        action="store_true",
        help="run tests that want more ranks than this machine has cores (else skipped)",
    )
    group.addoption(
        "--mpi-hosts",
        metavar="H1,H2,...",
        help="run each marked test's job across these hosts (over ssh, as pycoll-run "
        "--hosts), its ranks spread evenly in blocks; the checkout must be at the same "
        "path on every host",
    )
    group.addoption("--mpi-worker", metavar="DIR", help=argparse.SUPPRESS)


@pytest.hookimpl(trylast=True)  # after the terminal reporter exists
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "mpi(ranks=N, timeout=SECONDS, min_size=N): run on N MPI ranks (pycoll.testing); "
        "min_size is pytest-mpi's spelling of ranks",
    )
    timeout = config.getoption("mpi_timeout")
    if timeout is not None and timeout <= 0:
        raise pytest.UsageError(f"--mpi-timeout {timeout:g}: give a positive number of seconds")
    hosts = config.getoption("mpi_hosts")
    if hosts is not None:
        job_mod.host_names(hosts)  # a UsageError now, not at the first marked test
    worker = config.getoption("mpi_worker")
    if worker:
        config.pluginmanager.register(InPlace(config, Path(worker)), "pycoll-mpi-mode")
    elif config.getoption("with_mpi", False):
        if not config.pluginmanager.has_plugin(PYTEST_MPI):  # else pytest-mpi runs in place
            config.pluginmanager.register(InPlace(config, None), "pycoll-mpi-mode")
    else:
        config.pluginmanager.register(Isolated(config), "pycoll-mpi-mode")


def marker_spec(item: pytest.Item) -> Optional[Tuple[int, float]]:
    """(ranks, timeout) of a test marked mpi, or None."""
    mark = item.get_closest_marker("mpi")
    if mark is None:
        return None
    ranks = mark.kwargs.get("ranks", mark.kwargs.get("min_size"))
    if ranks is None:
        ranks = mark.args[0] if mark.args else DEFAULT_RANKS
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.mpi(ranks={ranks!r}): ranks must be a positive integer"
        )
    timeout = mark.kwargs.get("timeout")
    if timeout is None:
        timeout = item.config.getoption("mpi_timeout") or DEFAULT_TIMEOUT_S
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.mpi(timeout={timeout!r}): give a positive number "
            f"of seconds"
        )
    return ranks, float(timeout)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# -- isolated mode: the controlling pytest -----------------------------------


def _report(
    item: pytest.Item, when: str, outcome: str, longrepr: Any, sections=()
) -> pytest.TestReport:
    return pytest.TestReport(
        nodeid=item.nodeid,
        location=item.location,
        keywords={k: 1 for k in item.keywords},
        outcome=outcome,  # type: ignore[arg-type]
        longrepr=longrepr,
        when=when,  # type: ignore[arg-type]
        sections=list(sections),
        duration=0.0,
        start=0.0,
        stop=0.0,
        user_properties=[],
    )


def _skip(item: pytest.Item, reason: str) -> List[pytest.TestReport]:
    _, lineno, _ = item.location
    where = (str(item.path), (lineno or 0) + 1, f"Skipped: {reason}")
    return [_report(item, "setup", "skipped", where), _report(item, "teardown", "passed", None)]


def _error(item: pytest.Item, text: str, when: str = "setup") -> List[pytest.TestReport]:
    """A failure outside the test's own code: ERROR at setup, or FAILED at call."""
    reports = []
    if when == "call":
        reports.append(_report(item, "setup", "passed", None))
    reports.append(_report(item, when, "failed", text))
    reports.append(_report(item, "teardown", "passed", None))
    return reports


class Isolated:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.ready: Dict[str, List[pytest.TestReport]] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Optional[pytest.Item]):
        spec = marker_spec(item)
        if spec is None:
            return None
        reports = self.ready.pop(item.nodeid, None)
        if reports is None:
            ranks = spec[0]
            hosts = self.config.getoption("mpi_hosts")
            if not hosts and ranks > _cores() and not self.config.getoption("mpi_oversubscribe"):
                reports = _skip(
                    item,
                    f"needs {ranks} MPI ranks and this machine has {_cores()} cores "
                    f"(--mpi-oversubscribe runs it anyway)",
                )
            else:
                self.run_group(item, spec)
                reports = self.ready.pop(item.nodeid)
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for report in reports:
            ihook.pytest_runtest_logreport(report=report)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def group_of(self, item: pytest.Item, ranks: int) -> List[pytest.Item]:
        every_file = self.config.getoption("mpi_reuse_all")
        if not every_file and not self.config.getoption("mpi_reuse"):
            return [item]
        items = item.session.items
        group = []
        for other in items[items.index(item) :]:
            spec = marker_spec(other)
            if spec is None or spec[0] != ranks or other.nodeid in self.ready:
                continue
            if every_file or other.path == item.path:
                group.append(other)
        return group

    def run_group(self, item: pytest.Item, spec: Tuple[int, float]) -> None:
        ranks = spec[0]
        group = self.group_of(item, ranks)
        timeouts = {i.nodeid: marker_spec(i)[1] for i in group}  # type: ignore[index]
        rootdir = self.config.rootpath
        nodeids = [i.nodeid for i in group]
        files = list(dict.fromkeys(str(i.path) for i in group))
        live = self.config.getoption("capture") == "no"
        args = ["--rootdir", str(rootdir)]
        if self.config.inipath is not None:
            args += ["-c", str(self.config.inipath)]
        args += ["-s"] if live else []
        if self.config.pluginmanager.has_plugin(PYTEST_MPI):
            args += ["-p", f"no:{PYTEST_MPI}"]  # its skip of mpi tests without --with-mpi
        args += ["--import-mode", self.config.getoption("importmode")]
        result = job_mod.run(
            nodeids,
            files,
            ranks,
            timeouts,
            START_ALLOWANCE_S,
            Path(self.config.invocation_params.dir),
            args,
            live,
            hosts=self.config.getoption("mpi_hosts"),
        )
        index = self.index(result)
        ran_any = any("start" in r for seen in index.values() for r in seen.values())
        for member in group:
            seen = index.get(member.nodeid, {})
            if ran_any and member is not item and not seen:
                # The job ended (an earlier test of it hung or crashed) before
                # this one started: it runs in a fresh job, with the tests after
                # it, when its turn comes, so a hang or crash costs one test only.
                # (The first test of a job always gets an outcome: no loop.)
                continue
            self.ready[member.nodeid] = self.outcome(
                member, ranks, result, seen, timeouts[member.nodeid]
            )

    def index(self, result: job_mod.JobResult) -> Dict[str, Dict[int, Dict[str, Any]]]:
        """test -> rank -> its phase reports, and "start" if the rank began it."""
        found: Dict[str, Dict[int, Dict[str, Any]]] = {}
        for rank, records in result.records.items():
            for record in records:
                if "start" in record:
                    found.setdefault(record["start"], {}).setdefault(rank, {})["start"] = True
                elif "report" in record:
                    report = self.config.hook.pytest_report_from_serializable(
                        config=self.config, data=record["report"]
                    )
                    if isinstance(report.longrepr, list):  # a skip's (path, line, reason)
                        report.longrepr = tuple(report.longrepr)  # as JSON could not keep it
                    found.setdefault(report.nodeid, {}).setdefault(rank, {})[report.when] = report
        return found

    def outcome(
        self,
        item: pytest.Item,
        ranks: int,
        result: job_mod.JobResult,
        seen: Dict[int, Dict[str, Any]],
        timeout: float,
    ) -> List[pytest.TestReport]:
        phases: Dict[int, Dict[str, pytest.TestReport]] = {}
        started: Dict[int, bool] = {}
        for rank in range(ranks):
            mine = seen.get(rank, {})
            started[rank] = bool(mine.get("start"))
            phases[rank] = {w: mine[w] for w in PHASES if w in mine}
        unfinished = [r for r in range(ranks) if "teardown" not in phases[r]]
        if not unfinished:
            return merge_phases(item, phases)
        output = prefixed(result.output)
        running = [r for r in unfinished if started[r]]
        if result.timed_out:
            if running:
                return _error(
                    item,
                    f"timed out: ranks {','.join(map(str, running))} ran past the test's "
                    f"timeout ({timeout:g} s). The job's output, with every rank's Python "
                    f"stack:\n{output}",
                    when="call",
                )
            return _error(item, "not run: its job was ended by an earlier test's timeout")
        crash = self.crash_text(result)
        if running:
            return _error(
                item,
                f"{crash} while this test ran (ranks {','.join(map(str, running))} did not "
                f"finish it). The job's output:\n{output}",
            )
        if any(started.values()) or any(result.records.values()):
            return _error(item, f"not run: {crash} in an earlier test of its job")
        collect = [
            (r, rec["collect"]) for r in range(ranks) for rec in result.records.get(r, [])
            if "collect" in rec
        ]  # fmt: skip
        if collect:
            return _error(item, "the job could not collect it:\n" + labelled(collect))
        return _error(item, f"the job ended before this test started ({crash}):\n{output}")

    @staticmethod
    def crash_text(result: job_mod.JobResult) -> str:
        bad = [(r, c) for r, c in sorted(result.exits.items()) if c not in (0, None)]
        if not bad:
            return f"the job ended with status {result.status}"
        if result.first_failure is not None:
            bad = [result.first_failure]
        return "; ".join(
            f"rank {rank} on {result.hosts.get(rank, '?')} crashed: "
            + describe_exit(code).removeprefix("was ")  # "killed by SIGSEGV"
            for rank, code in bad
        )


def merge_phases(
    item: pytest.Item, phases: Dict[int, Dict[str, pytest.TestReport]]
) -> List[pytest.TestReport]:
    """Each phase's reports from every rank, as the one report pytest shows."""
    merged = []
    for when in PHASES:
        present = {r: p[when] for r, p in phases.items() if when in p}
        if not present:
            continue
        report = merge_reports(present)
        merged.append(report)
        if when == "setup" and report.outcome != "passed":
            teardown = {r: p["teardown"] for r, p in phases.items() if "teardown" in p}
            merged.append(merge_reports(teardown))
            break
    return merged


def merge_reports(reports: Dict[int, pytest.TestReport]) -> pytest.TestReport:
    first = reports[min(reports)]
    outcome, text = combine(
        [(r, rep.outcome, rep.longreprtext) for r, rep in sorted(reports.items())]
    )
    if text is None:
        return first
    failing = [r for r, rep in sorted(reports.items()) if rep.outcome == "failed"]
    first.outcome = outcome  # type: ignore[assignment]
    first.longrepr = text
    first.sections = [
        (f"{name} (rank {r})", content) for r in failing for name, content in reports[r].sections
    ]
    first.duration = max(rep.duration for rep in reports.values())
    return first


# -- in place and worker modes: this process is a rank -----------------------

# Between two tests of a job the first rank there waits for the last. MPI's
# blocking barrier polls flat out, on a core the last rank may need (the
# suite's jobs have more ranks than the machine has cores): this one yields
# the core between tests of its request and, past a millisecond, sleeps.
_BARRIER_SPIN_S = 1e-3
_BARRIER_PAUSE_S = 2e-4


def _barrier(comm: Any) -> None:
    request = comm.Ibarrier()
    start = time.monotonic()
    while not request.Test():
        if time.monotonic() - start < _BARRIER_SPIN_S:
            os.sched_yield()
        else:
            time.sleep(_BARRIER_PAUSE_S)


class InPlace:
    def __init__(self, config: pytest.Config, worker_dir: Optional[Path]) -> None:
        MPI = _mpi.load()  # MPI starts as pycoll starts it (its MPI_Init variables)

        self.config = config
        self.comm = MPI.COMM_WORLD.Dup()  # the plugin's traffic, apart from the tests'
        self.test_comm = MPI.COMM_WORLD.Dup()  # what the comm fixture hands out
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.out: Optional[IO[str]] = None
        self.worker_dir = worker_dir
        if worker_dir is not None:
            self.out = open(worker_dir / f"rank{self.rank}.jsonl", "a")
        if self.out is not None or self.rank:
            # In place, rank 0 reports for every rank (outcomes are merged
            # below); a worker's reports go to its file, not to a terminal.
            reporter = config.pluginmanager.getplugin("terminalreporter")
            if reporter is not None:
                config.pluginmanager.unregister(reporter)

    def write(self, record: Dict[str, Any]) -> None:
        assert self.out is not None
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()  # what is written survives a crash of this process

    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: List[pytest.Item]
    ) -> None:
        if self.worker_dir is not None:  # run what the controller chose, in its order
            wanted = (self.worker_dir / "nodeids").read_text().split("\n")
            by_id = {item.nodeid: item for item in items}
            items[:] = [by_id[n] for n in wanted if n in by_id]
            return
        for item in items:
            spec = marker_spec(item)
            if spec is None:
                continue
            mark = item.get_closest_marker("mpi")
            assert mark is not None
            if "min_size" in mark.kwargs and self.size >= spec[0]:
                continue  # pytest-mpi: at least min_size ranks
            if spec[0] != self.size:
                item.add_marker(
                    pytest.mark.skip(reason=f"needs {spec[0]} MPI ranks; this job has {self.size}")
                )

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        if self.out is not None:
            self.write({"start": nodeid})

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        if self.out is not None and self.size > 1:
            # Tests sharing a job start together: no rank begins the next test
            # (and sends its messages) while another still runs this one, which
            # could receive them (MPI_ANY_SOURCE). In place, the exchange of
            # outcomes after each phase does the same.
            _barrier(self.comm)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.out is not None:
            data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
            self.write({"report": data})

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if self.out is not None and report.failed:
            self.write({"collect": f"{report.nodeid}: {report.longreprtext}"})

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call) -> Generator[None, Any, Any]:
        report = yield
        if self.out is not None or self.size == 1:
            return report
        mine = (report.outcome, report.longreprtext if report.failed else "")
        everyone = self.comm.allgather(mine)
        merged, text = combine([(r, o, t) for r, (o, t) in enumerate(everyone)])
        if text is not None:
            report.outcome = merged
            report.longrepr = text
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.out is not None:
            # A worker's tests may fail; the process itself succeeded. A non-zero
            # status would make the supervisor end the other ranks early.
            session.exitstatus = 0
            self.out.close()


# -- fixtures ------------------------------------------------------------------


@pytest.fixture(scope="session")
def comm(request: pytest.FixtureRequest):
    """The test's mpi4py communicator: a duplicate of the job's COMM_WORLD."""
    mode = request.config.pluginmanager.get_plugin("pycoll-mpi-mode")
    if isinstance(mode, InPlace):
        return mode.test_comm
    return _mpi.load().COMM_WORLD.Dup()


@pytest.fixture
def rank(comm) -> int:
    return int(comm.Get_rank())


@pytest.fixture
def world_size(comm) -> int:
    return int(comm.Get_size())


@pytest.fixture
def pg():
    """pycoll's default group, initialized for the test and destroyed after it."""
    import pycoll

    created = not pycoll.is_initialized()
    if created:
        pycoll.init_process_group()
    yield pycoll.group.WORLD
    if created and pycoll.is_initialized():
        pycoll.destroy_process_group()


@pytest.fixture
def mpi_tmp_path(comm) -> Iterator[Path]:
    """One directory for all ranks of the test, removed after it (rank 0 makes it)."""
    path = tempfile.mkdtemp(prefix="pycoll-mpi-") if comm.Get_rank() == 0 else None
    path = comm.bcast(path, root=0)
    comm.Barrier()
    yield Path(path)
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
