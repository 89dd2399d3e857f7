"""pycoll.testing on itself: small test files run by a child pytest (pytester),
whose multi-rank tests run as real MPI jobs. Every inner test asserts on every
rank; the outer test checks the one outcome pytest reports for all of them."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from pycoll.launch.families import Job, choose
from support import reaped, signals_as, still_alive

pytest_plugins = ["pytester"]
HOST = socket.gethostname()
# CI runs these tests a second time with pytest-mpi importable (scripts/test):
# pycoll.testing must then leave --with-mpi and the in-place mode to it.
PYTEST_MPI = importlib.util.find_spec("pytest_mpi") is not None
# The variables of a launcher running this pytest must not reach the child's jobs.
_LEAKS = ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALRANKID", "OMPI_", "PRTE_", "SLURM_", "PYCOLL_")


# What the pass beside pytest-mpi runs again (scripts/test): the plugin's
# options, marker and modes, and one job of each outcome, where pytest-mpi's own
# hooks could interfere. The others (timeouts, signals, reruns, -x, output) test
# the job machinery, which those same jobs go through unchanged.
BESIDE = pytest.mark.beside_pytest_mpi


@pytest.fixture(autouse=True)
def one_rank(world_size, monkeypatch):
    if world_size != 1:
        pytest.skip("starts its own pytest and MPI jobs; runs in the single-rank pass")
    for key in list(os.environ):
        if key.startswith(_LEAKS):
            monkeypatch.delenv(key)
    monkeypatch.setenv("COLUMNS", "400")  # summary lines in full


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner=source)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)


@BESIDE
def test_pass_and_one_rank_failing(pytester):
    result = run(
        pytester,
        """
        import pytest

        @pytest.mark.mpi(ranks=2)
        def test_good(comm, rank, world_size):
            assert (world_size, comm.Get_size()) == (2, 2)
            assert comm.allreduce(rank) == 1

        @pytest.mark.mpi(ranks=2)
        def test_rank1_bad(comm):
            print(f"printed by rank {comm.rank}")
            assert comm.rank != 1, "rank 1 disagrees"
        """,
    )
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*_ test_rank1_bad _*", "---------- rank 1 ----------"])
    assert "AssertionError: rank 1 disagrees" in out
    assert "---------- rank 0 ----------" not in out
    result.stdout.fnmatch_lines(["*Captured stdout call (rank 1)*", "printed by rank 1"])
    assert "printed by rank 0" not in out  # a passing rank's output is not shown
    result.stdout.fnmatch_lines(["FAILED test_inner.py::test_rank1_bad - *"])


@BESIDE
def test_failure_on_every_rank(pytester):
    result = run(
        pytester,
        """
        import pytest

        @pytest.mark.mpi(ranks=2)
        def test_bad(comm):
            assert comm.rank < 0, f"rank {comm.rank} fails"
        """,
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["---------- rank 0 ----------", "*rank 0 fails*", "---------- rank 1 ----------",
         "*rank 1 fails*"]
    )  # fmt: skip


CRASHES = {
    "segfault": ("import ctypes; ctypes.string_at(0)", "crashed: killed by SIGSEGV"),
    "os._exit": ("import os; os._exit(3)", "crashed: exited with code 3"),
}


@BESIDE
@pytest.mark.parametrize("how", sorted(CRASHES))
def test_crash_on_one_rank_is_an_error_and_the_next_test_runs(pytester, how):
    code, words = CRASHES[how]
    result = run(
        pytester,
        f"""
        import pytest

        @pytest.mark.mpi(ranks=2)
        def test_crash(comm):
            if comm.rank == 1:
                {code}
            comm.Barrier()

        @pytest.mark.mpi(ranks=2)
        def test_next(comm):
            assert comm.allreduce(1) == 2
        """,
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [f"ERROR test_inner.py::test_crash - rank 1 on {HOST} {words} while this test ran*"]
    )
    if how == "segfault":  # faulthandler's report of where it happened
        result.stdout.fnmatch_lines(
            ["[[]1[]] Fatal Python error: Segmentation fault", "*in test_crash"]
        )


def test_mpi_abort_is_an_error(pytester):
    result = run(
        pytester,
        """
        import pytest

        @pytest.mark.mpi(ranks=2)
        def test_abort(comm):
            if comm.rank == 1:
                comm.Abort(5)
            comm.Barrier()
        """,
    )
    result.assert_outcomes(errors=1)
    # Which rank the launcher reports first varies by MPI (Hydra gives every
    # rank the abort code); the code does not.
    result.stdout.fnmatch_lines(
        [f"ERROR test_inner.py::test_abort - rank ? on {HOST} crashed: exited with code 5*"]
    )


def test_deadlock_ends_at_the_timeout_with_every_ranks_stack(pytester):
    result = run(
        pytester,
        """
        import pytest

        @pytest.mark.mpi(ranks=2, timeout=3)
        def test_deadlock(comm):
            if comm.rank == 0:
                comm.recv(source=1)
            else:
                comm.Barrier()

        @pytest.mark.mpi(ranks=2)
        def test_after(comm):
            assert comm.allreduce(1) == 2
        """,
    )
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "timed out: ranks 0,1 ran past the test's timeout (3 s)" in out
    for rank in (0, 1):  # each rank's stack points into the test
        assert re.search(
            rf'^\[{rank}\]   File "[^"]*test_inner\.py", line \d+ in test_deadlock$', out, re.M
        ), out
    assert "_pytest" not in out.split("test_deadlock _")[1].split("short test summary")[0]


@BESIDE
def test_skips(pytester):
    result = run(
        pytester,
        """
        import pytest

        @pytest.mark.mpi(ranks=2)
        def test_all_skip(comm):
            pytest.skip("nothing here")

        @pytest.mark.mpi(ranks=2)
        def test_some_skip(comm):
            if comm.rank == 0:
                pytest.skip("only rank 0 skips")
        """,
        "-rsf",
    )
    result.assert_outcomes(skipped=1, failed=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_inner.py:*: nothing here"])
    result.stdout.fnmatch_lines(
        ["FAILED test_inner.py::test_some_skip - ranks disagree on the outcome: rank 0 skipped, "
         "rank 1 passed"]
    )  # fmt: skip


def test_parametrized_and_k_selection(pytester):
    source = """
        import pytest

        @pytest.mark.mpi(ranks=2)
        @pytest.mark.parametrize("n", [1, 2, 3])
        def test_param(comm, n):
            assert comm.allreduce(n) == 2 * n
        """
    run(pytester, source, "-v").assert_outcomes(passed=3)
    result = run(pytester, source, "-v", "-k", "2")
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(["*test_param[[]2[]] PASSED*"])


def test_x_stops_after_the_first_failure(pytester):
    result = run(
        pytester,
        """
        import pytest

        @pytest.mark.mpi(ranks=2)
        def test_first(comm):
            assert False

        @pytest.mark.mpi(ranks=2)
        def test_second(comm):
            pass
        """,
        "-x",
    )
    result.assert_outcomes(failed=1)


def test_last_failed_reruns_only_the_failure(pytester):
    pytester.makepyfile(
        test_inner="""
        import pytest

        @pytest.mark.mpi(ranks=2)
        def test_ok(comm):
            pass

        @pytest.mark.mpi(ranks=2)
        def test_bad(comm):
            assert comm.rank == 0
        """
    )
    pytester.runpytest_subprocess(timeout=120).assert_outcomes(passed=1, failed=1)
    again = pytester.runpytest_subprocess("--lf", "-v", timeout=120)
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*test_inner.py::test_bad FAILED*"])
    assert "test_ok" not in again.stdout.str()


@pytest.mark.parametrize("fault", ["hang", "crash"])
def test_with_reuse_a_hang_or_crash_costs_that_test_alone(pytester, monkeypatch, tmp_path, fault):
    """One job runs the file's tests (--mpi-reuse); the second hangs (or a
    rank dies) in it: the tests after it run in a fresh job and pass."""
    pids = tmp_path / "pids"
    monkeypatch.setenv("PIDS", str(pids))
    bad = (
        "comm.recv(source=1) if comm.rank == 0 else comm.Barrier()"
        if fault == "hang"
        else "os._exit(3) if comm.rank == 1 else comm.Barrier()"
    )
    result = run(
        pytester,
        f"""
        import os
        import pytest

        def note(comm, name):
            with open(os.environ["PIDS"], "a") as f:
                f.write(f"{{name}} {{os.getpid()}}\\n")
            comm.Barrier()

        @pytest.mark.mpi(ranks=2, timeout=5)
        def test_before(comm):
            note(comm, "before")

        @pytest.mark.mpi(ranks=2, timeout=5)
        def test_fault(comm):
            note(comm, "fault")
            {bad}

        @pytest.mark.mpi(ranks=2, timeout=5)
        def test_after(comm):
            note(comm, "after")

        @pytest.mark.mpi(ranks=2, timeout=5)
        def test_last(comm):
            note(comm, "last")
            assert comm.allreduce(1) == 2
        """,
        "--mpi-reuse",
    )
    if fault == "hang":
        result.assert_outcomes(passed=3, failed=1)
        result.stdout.fnmatch_lines(["FAILED test_inner.py::test_fault - timed out: ranks 0,1*"])
    else:
        result.assert_outcomes(passed=3, errors=1)
        result.stdout.fnmatch_lines(["ERROR test_inner.py::test_fault - rank 1 on * crashed*"])
    assert "not run" not in result.stdout.str()
    by_test = {}
    for line in pids.read_text().splitlines():
        name, pid = line.split()
        by_test.setdefault(name, set()).add(int(pid))
    assert by_test["before"] == by_test["fault"]  # one job, reused
    assert not by_test["after"] & by_test["fault"]  # a fresh job after the fault
    assert by_test["after"] == by_test["last"]  # which the rest share


def _inner_session(pytester, disposition) -> subprocess.Popen:
    """pytest on test_inner.py in a process of its own, its SIGINT and SIGTERM
    set to ``disposition``, its output in one pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_inner.py"],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=signals_as(disposition),
    )


def _wait_for_lines(proc: subprocess.Popen, path, n: int) -> None:
    """Until ``path`` holds ``n`` lines (the ranks wrote them), at most 120 s."""
    deadline = time.monotonic() + 120
    while len(path.read_text().splitlines() if path.exists() else []) < n:
        assert proc.poll() is None and time.monotonic() < deadline, "the job did not start"
        time.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_pytest_ends_the_session_not_only_its_job(pytester, tmp_path, signum):
    """Ctrl-C (or a kill) while a job runs stops its ranks and ends the
    session: the next test is not started in a fresh job, as it is after a
    hang or a crash."""
    pids = tmp_path / "pids"
    pytester.makepyfile(
        test_inner=f"""
        import os
        import time
        import pytest

        @pytest.mark.mpi(ranks=2, timeout=300)
        @pytest.mark.parametrize("n", [1, 2])
        def test_long(comm, n):
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{n}} {{os.getpid()}}\\n")
            comm.Barrier()
            time.sleep(300)  # the work the signal interrupts
        """
    )
    # (not ignored, whatever this suite's are)
    with reaped(_inner_session(pytester, signal.SIG_DFL)) as proc:
        _wait_for_lines(proc, pids, 2)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
    started = [line.split() for line in pids.read_text().splitlines()]
    assert sorted(n for n, _ in started) == ["1", "1"], out  # the second test never started
    assert still_alive([int(pid) for _, pid in started]) == []
    if signum == signal.SIGINT:
        assert proc.returncode == 2, out  # pytest's "interrupted"
        assert "KeyboardInterrupt" in out
    else:
        assert proc.returncode == -signal.SIGTERM, out


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_the_session_ignores_leaves_its_job_running(pytester, tmp_path, signum):
    """A session started with the signal ignored (a shell's background job
    ignores SIGINT) goes on ignoring it while a job runs: the job is not
    stopped, so the session does not lose a test to a signal it then goes on
    past."""
    pids = tmp_path / "pids"
    go = tmp_path / "go"
    pytester.makepyfile(
        test_inner=f"""
        import os
        import time
        import pytest

        @pytest.mark.mpi(ranks=2, timeout=300)
        def test_waits(comm):
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            comm.Barrier()
            deadline = time.monotonic() + 120
            while not os.path.exists({str(go)!r}):  # until the signal was sent
                assert time.monotonic() < deadline
                time.sleep(0.05)
        """
    )
    with reaped(_inner_session(pytester, signal.SIG_IGN)) as proc:
        _wait_for_lines(proc, pids, 2)
        proc.send_signal(signum)  # (an ignored signal is dropped as it is sent)
        go.touch()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "1 passed" in out, out


SHARED_PIDS = """
    import os
    import pytest

    @pytest.mark.mpi(ranks=2)
    @pytest.mark.parametrize("n", [1, 2])
    def test_pid(comm, n):
        with open(os.environ["PIDS"], "a") as f:
            f.write(f"{n} {os.getpid()}\\n")
        comm.Barrier()
"""


@BESIDE
@pytest.mark.parametrize("reuse", [False, True])
def test_isolation_by_default_and_sharing_with_mpi_reuse(pytester, monkeypatch, tmp_path, reuse):
    pids = tmp_path / "pids"
    monkeypatch.setenv("PIDS", str(pids))
    result = run(pytester, SHARED_PIDS, *(["--mpi-reuse"] if reuse else []))
    result.assert_outcomes(passed=2)
    by_test = {}
    for line in pids.read_text().splitlines():
        n, pid = line.split()
        by_test.setdefault(n, set()).add(int(pid))
    assert len(by_test["1"]) == len(by_test["2"]) == 2  # two ranks each
    assert (by_test["1"] == by_test["2"]) is reuse


@BESIDE
def test_fixtures(pytester):
    result = run(
        pytester,
        """
        import pytest
        import pycoll

        @pytest.mark.mpi(ranks=2)
        def test_shared_dir_and_group(comm, mpi_tmp_path, pg, rank):
            if rank == 0:
                (mpi_tmp_path / "note").write_text("from rank 0")
            comm.Barrier()
            assert (mpi_tmp_path / "note").read_text() == "from rank 0"
            assert pycoll.is_initialized() and pycoll.get_world_size() == 2
            x = pycoll.all_reduce  # the group works
            import numpy as np
            a = np.full(3, rank + 1.0)
            pycoll.all_reduce(a)
            assert a.tolist() == [3.0, 3.0, 3.0]
        """,
    )
    result.assert_outcomes(passed=1)


def test_live_output_with_s(pytester):
    result = run(
        pytester,
        """
        import pytest

        @pytest.mark.mpi(ranks=2)
        def test_talk(comm):
            print(f"hello from {comm.rank}", flush=True)
        """,
        "-s",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*[[]0[]] hello from 0*"])
    result.stdout.fnmatch_lines(["*[[]1[]] hello from 1*"])


@BESIDE
def test_more_ranks_than_cores_skip_unless_oversubscribed(pytester):
    cores = len(os.sched_getaffinity(0))
    source = f"""
        import pytest

        @pytest.mark.mpi(ranks={cores + 1})
        def test_big(comm):
            assert comm.Get_size() == {cores + 1}
        """
    result = run(pytester, source, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [f"*needs {cores + 1} MPI ranks and this machine has {cores} cores "
         f"(--mpi-oversubscribe runs it anyway)"]
    )  # fmt: skip
    run(pytester, source, "--mpi-oversubscribe").assert_outcomes(passed=1)


@BESIDE
def test_pytest_mpi_spelling(pytester):
    result = run(
        pytester,
        """
        import pytest

        @pytest.mark.mpi(min_size=2)
        def test_min(comm):
            assert comm.Get_size() == 2
        """,
    )
    result.assert_outcomes(passed=1)


@BESIDE
@pytest.mark.parametrize(
    "mark, problem",
    [
        ("ranks=0", "ranks must be a positive integer"),
        ("ranks=2, timeout=-1", "give a positive number of seconds"),
    ],
)
def test_bad_marker(pytester, mark, problem):
    result = run(
        pytester,
        f"""
        import pytest

        @pytest.mark.mpi({mark})
        def test_it(comm):
            pass
        """,
    )
    assert result.ret != 0
    result.stderr.fnmatch_lines([f"*test_inner.py::test_it: @pytest.mark.mpi(*): {problem}*"])


def in_place(pytester, *options):
    """Run test_inner.py in place under this Python's mpiexec on 2 ranks."""
    # The command line of this Python's mpiexec, as pycoll-run would build it
    # (Open MPI refuses root and oversubscription without flags).
    family, mpiexec, _ = choose(None, {})
    program = [sys.executable, "-m", "pytest", "--with-mpi", "-rs", "-p", "no:cacheprovider",
               "--color=no", *options, "test_inner.py"]  # fmt: skip
    env = {**os.environ, **family.defaults()}
    return subprocess.run(
        family.command(mpiexec, Job(nprocs=2, program=program)),
        cwd=pytester.path, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


@BESIDE
@pytest.mark.skipif(not PYTEST_MPI, reason="pytest-mpi is not installed (its own pass)")
def test_beside_pytest_mpi_in_place_is_pytest_mpis(pytester):
    """With pytest-mpi installed, --with-mpi is its option and runs its in-place
    mode (every rank reports, then its MPI summary); pycoll's isolated jobs
    still run (every other test of this file passes in that pass too)."""
    pytester.makepyfile(
        test_inner="""
        import pytest

        @pytest.mark.mpi(min_size=2)
        def test_two(comm, rank):
            assert comm.allreduce(rank) == 1
        """
    )
    proc = in_place(pytester)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert out.count("1 passed") == 2, out  # each rank reports for itself
    assert out.count("MPI Information") == 2, out  # pytest-mpi's summary
    helped = subprocess.run(
        [sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    assert "--only-mpi" in helped and "--mpi-reuse" in helped  # both plugins loaded


@BESIDE
@pytest.mark.skipif(PYTEST_MPI, reason="in place is pytest-mpi's when it is installed")
def test_in_place_under_mpiexec(pytester):
    pytester.makepyfile(
        test_inner="""
        import pytest

        @pytest.mark.mpi(ranks=2)
        def test_two(comm, rank):
            assert comm.allreduce(rank) == 1

        @pytest.mark.mpi(ranks=3)
        def test_three(comm):
            assert comm.Get_size() == 3

        def test_unmarked(comm):
            assert comm.Get_rank() == 0, f"rank {comm.Get_rank()} is not 0"
        """
    )
    proc = in_place(pytester)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "1 failed, 1 passed, 1 skipped" in out  # one report, from rank 0, for both
    assert out.count("short test summary info") == 1
    assert "---------- rank 1 ----------" in out and "rank 1 is not 0" in out
    assert "needs 3 MPI ranks; this job has 2" in out


def test_tests_sharing_a_job_do_not_overlap(pytester):
    """Rank 1 finishes test_a and would send test_b's message to rank 0 while
    rank 0 still waits, in test_a, for a message from any rank."""
    result = run(
        pytester,
        """
        import pytest
        from mpi4py import MPI

        @pytest.mark.mpi(ranks=3, timeout=20)
        def test_a(comm):
            if comm.rank == 0:
                assert comm.recv(source=MPI.ANY_SOURCE, tag=9) == "a from 1"
                comm.send("go", dest=2, tag=8)
                assert comm.recv(source=MPI.ANY_SOURCE, tag=9) == "a from 2"
            elif comm.rank == 1:
                comm.send("a from 1", dest=0, tag=9)
            else:
                assert comm.recv(source=0, tag=8) == "go"
                comm.send("a from 2", dest=0, tag=9)

        @pytest.mark.mpi(ranks=3, timeout=20)
        def test_b(comm):
            if comm.rank == 1:
                comm.send("b from 1", dest=0, tag=9)
            if comm.rank == 0:
                assert comm.recv(source=1, tag=9) == "b from 1"
        """,
        "--mpi-reuse",
        "--mpi-oversubscribe",
    )
    result.assert_outcomes(passed=2)
