"""Hangs turned into diagnoses: real 4-rank jobs that hang on purpose.

Each scenario of tests/hang_scenarios.py runs as its own MPI job (a hang or
an abort cannot be contained in the job running the suite), launched with the
mpiexec next to this Python. The test checks, on every surviving rank, that
the job ended in bounded time and that the error names the right ranks.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from mpi4py import MPI

from support import job_env, json_reports, run_mpiexec

SCRIPT = Path(__file__).with_name("hang_scenarios.py")
RANKS = 4
TIMEOUT_S = 1.5  # hang_scenarios.TIMEOUT
JOB_LIMIT_S = 90
OPEN_MPI = MPI.get_vendor()[0] == "Open MPI"


@pytest.fixture(autouse=True)
def one_rank(world_size):
    if world_size != 1:
        pytest.skip("launches its own 4-rank jobs; runs in the single-rank pass")


def run_job(
    scenario: str, *then: str, ranks: int = RANKS, **env: str
) -> Tuple[int, List[Dict], str, float]:
    environ = job_env()
    environ.pop("PYCOLL_DEBUG", None)
    environ.update(env)
    start = time.monotonic()
    argv = [sys.executable, str(SCRIPT), scenario, *then]
    proc = run_mpiexec(ranks, argv, env=environ, timeout=JOB_LIMIT_S)
    elapsed = time.monotonic() - start
    return proc.returncode, json_reports(proc.stdout), proc.stderr, elapsed


def by_rank(reports: List[Dict], size: int = RANKS) -> Dict[int, Dict]:
    ranks = {r["rank"]: r for r in reports if "destroyed" not in r and "made" not in r}
    assert sorted(ranks) == list(range(size)), reports
    return ranks


def finished_job(scenario: str, **env: str) -> Dict[int, Dict]:
    """Run ``scenario`` (:func:`run_job`); the job must end with status 0 and
    every rank must report once. Each rank's report, by rank."""
    rc, reports, err, _ = run_job(scenario, **env)
    ranks = by_rank(reports)
    assert rc == 0, err
    return ranks


def assert_timed_out(report: Dict, op: str, seq: int, missing: List[int]) -> None:
    assert report["error"] == "DistTimeoutError", report
    assert report["ranks"] == missing, report
    who = f"rank {missing[0]} has" if len(missing) == 1 else f"ranks {missing} have"
    head = (
        rf"^{op} \(seq {seq}\) on group '[^']+' timed out after \d+\.\d s "
        rf"\(timeout 1\.5 s\) on rank {report['rank']}: "
    )
    assert re.match(head + re.escape(f"{who} not reached seq {seq}."), report["message"]), report
    assert TIMEOUT_S <= report["seconds"] < TIMEOUT_S + 10, report
    for rank in missing:
        assert re.search(rf"\n  rank {rank}: has not reached it \(at seq \d+\)", report["message"])


def test_a_rank_skips_a_collective():
    ranks = finished_job("skip")
    assert ranks[2] == {"rank": 2, "skipped": True}
    for r in (0, 1, 3):
        assert_timed_out(ranks[r], "all_reduce", 2, [2])
        assert (
            "rank 2: has not reached it (at seq 1); last started all_reduce (seq 1)"
            in (ranks[r]["message"])
        )


def test_functional_results_of_a_timed_out_group_are_dropped_at_once():
    """A read of a pycoll.functional result times out with the diagnosis;
    dropping it and another pending result of the broken group then costs
    no second timeout, and destroy ends on every rank."""
    rc, reports, err, _ = run_job("functional", "destroy")
    assert rc == 0, err
    ranks: Dict[int, List[Dict]] = {}
    for report in reports:
        ranks.setdefault(report["rank"], []).append(report)
    assert sorted(ranks) == list(range(RANKS)), reports
    assert ranks[2][0] == {"rank": 2, "skipped": True}
    for r in (0, 1, 3):
        timed_out, dropped, destroyed = ranks[r]
        assert_timed_out(timed_out, "all_reduce", 2, [2])
        assert dropped["dropped"] < 0.5, dropped
        assert destroyed["destroyed"] is True


def test_ranks_call_overlapping_groups_in_different_orders():
    """Groups [0,1,2] ('first') and [1,2,3] ('second'): rank 1 enters first,
    rank 2 second, so each waits for the other."""
    ranks = finished_job("order")
    assert_timed_out(ranks[0], "all_reduce", 1, [2])
    assert_timed_out(ranks[1], "all_reduce", 1, [2])
    assert_timed_out(ranks[2], "all_reduce", 1, [1])
    assert_timed_out(ranks[3], "all_reduce", 1, [1])
    # Each side sees where the other one is stuck (a group it belongs to).
    assert (
        "rank 2: has not reached it (at seq 0); last started all_reduce (seq 1) on group "
        "'second', still in progress" in ranks[1]["message"]
    )
    assert (
        "rank 1: has not reached it (at seq 0); last started all_reduce (seq 1) on group "
        "'first', still in progress" in ranks[2]["message"]
    )


def test_a_rank_sleeps_past_the_timeout():
    ranks = finished_job("sleep")
    for r in (0, 1, 2):
        assert_timed_out(ranks[r], "all_reduce", 2, [3])
        assert (
            "rank 3: has not reached it (at seq 1); last started all_reduce (seq 1) on "
            "group 'default_pg', completed" in ranks[r]["message"]
        )
    # The sleeper arrives late and finds the others' abandoned operations.
    assert ranks[3]["error"] is None


def test_a_rank_exits_early():
    ranks = finished_job("exit")
    assert ranks[3] == {"rank": 3, "exited": True}
    for r in (0, 1, 2):
        assert_timed_out(ranks[r], "all_reduce", 2, [3])


def destroyed(reports: List[Dict]) -> Dict[int, Dict]:
    ranks = {r["rank"]: r for r in reports if "destroyed" in r}
    assert sorted(ranks) == list(range(RANKS)), reports
    return ranks


@pytest.mark.parametrize("scenario", ["skip", "sleep"])
def test_destroy_after_a_timeout_ends_on_every_rank(scenario):
    """After a timeout the group's MPI state is unknown: destroy_process_group
    and the exit after it must not wait on the other ranks for good (they hung
    in the progress board's MPI_Win_free, and Open MPI crashed at exit)."""
    rc, reports, err, elapsed = run_job(scenario, "destroy")
    assert rc == 0, err
    for report in destroyed(reports).values():
        # The healthy rank waits at most for the others' timeouts to end.
        assert report["seconds"] < 4 * TIMEOUT_S + 10, report
    timed_out = [r for r, rep in by_rank(reports).items() if rep.get("error")]
    for rank in timed_out:
        assert f"pycoll: rank {rank}: an operation timed out on this rank" in err, err
    assert err.count("an operation timed out on this rank") == len(timed_out), err


def test_a_mismatch_no_rank_waits_in_is_found_in_bound_and_teardown_makes_no_call():
    """Two ranks broadcast 300 times, each naming itself the root: no rank ever
    waits, yet the call check must find it on every rank within 2 x EVERY
    calls (a root ran all 300 before), and teardown must then make no
    collective call on the mismatched state (MPICH crashed with SIGSEGV in
    the progress board's vote, 1 run in 3). Intermittent: several jobs. The
    group's timeout is long: no rank waits on another here, so nothing may time
    out, and 1.5 s was seen to pass in the call check's exchange alone on a
    machine busy with other jobs."""
    every = 128  # pycoll.crosscheck.DEFAULT_EVERY
    for _ in range(4):
        rc, reports, err, elapsed = run_job("self_root", "destroy", ranks=2, PYCOLL_TIMEOUT="60")
        assert rc == 0 and "Segmentation fault" not in err, err[-3000:]
        made = {r["rank"]: r["made"] for r in reports if "made" in r}
        for rank, report in by_rank(reports, 2).items():
            assert report["error"] == "CollectiveMismatchError", report
            assert "called different collectives at seq 2: " in report["message"], report
            assert made[rank] <= 2 * every, (rank, made)  # seq 2 is the first broadcast
        assert sorted(r["rank"] for r in reports if "destroyed" in r) == [0, 1], reports
        assert err.count("the call check found a group's ranks disagreeing") == 2, err[-3000:]
        assert elapsed < JOB_LIMIT_S


def test_an_uncaught_exception_on_one_rank_ends_the_job():
    """Under plain mpiexec, with a 10-minute timeout: the others do not wait for it."""
    rc, reports, err, elapsed = run_job("raise", PYCOLL_TIMEOUT="600")
    assert rc != 0
    assert elapsed < 30, elapsed
    assert "ValueError: rank 2 gives up" in err, err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert (
        "pycoll: rank 2: uncaught ValueError; aborting the job so that the other ranks do "
        "not wait for it (PYCOLL_ABORT_ON_EXCEPTION=0 turns this off)" in err
    ), err
    assert not [r for r in reports if "error" in r], reports  # nobody got past it


def test_the_abort_on_an_uncaught_exception_can_be_turned_off():
    rc, reports, err, _ = run_job("raise", PYCOLL_ABORT_ON_EXCEPTION="0")
    assert rc != 0
    assert "ValueError: rank 2 gives up" in err, err
    assert "aborting the job" not in err
    ranks = {r["rank"]: r for r in reports}
    assert sorted(ranks) == [0, 1, 3], reports
    for r in (0, 1, 3):  # they waited for rank 2 until their timeout
        assert_timed_out(ranks[r], "all_reduce", 2, [2])


def test_a_stopped_rank_is_named():
    """Rank 3 is SIGSTOPped inside seq 2 (resumed 6 s later): every rank has
    started seq 2, and the ranks that time out name the one that does not
    progress. Which of the others finish depends on MPI's algorithm."""
    if OPEN_MPI:
        # Its MPI_Finalize goes on with the abandoned 8 MiB transfer: seen to
        # crash there, and once (CI) to hang past the job's limit.
        pytest.skip("Open MPI's MPI_Finalize crashes or hangs on the abandoned transfer")
    ranks = finished_job("stop")
    assert_culprit_named(
        ranks,
        3,
        "rank 3 started seq 2 but is not progressing in it (stopped, or stuck outside "
        "pycoll's waits).",
        "\n  rank 3: reached it but is not progressing in it",
    )


def test_a_different_collective_at_the_same_seq_is_named():
    """Rank 1 calls barrier where the others call all_reduce (seq 2)."""
    ranks = finished_job("barrier")
    assert_culprit_named(
        ranks,
        1,
        "rank 1 called a different collective at seq 2 (see below): every rank must call "
        "the same collectives in the same order.",
        "\n  rank 1: reached it but called barrier there, not all_reduce",
    )


def assert_culprit_named(ranks: Dict[int, Dict], culprit: int, summary: str, line: str) -> None:
    """Every other rank either finished (MPI's algorithm did not need the
    culprit there) or timed out naming it; at least one needed it."""
    others = [r for r in range(RANKS) if r != culprit]
    waited = [r for r in others if ranks[r]["error"]]
    assert waited, ranks
    for r in others:
        if r in waited:
            assert ranks[r]["error"] == "DistTimeoutError", ranks[r]
            assert ranks[r]["ranks"] == [culprit], ranks[r]
            assert summary in ranks[r]["message"] and line in ranks[r]["message"], ranks[r]
        else:
            assert ranks[r]["error"] is None, ranks[r]


def test_pycoll_timeout_sets_the_default_timeout():
    """PYCOLL_TIMEOUT (seconds) is the default group's timeout: a hang is
    diagnosed without editing the program."""
    ranks = finished_job("skip", PYCOLL_TIMEOUT="1.5")
    for r in (0, 1, 3):
        assert_timed_out(ranks[r], "all_reduce", 2, [2])


def test_shape_mismatch_under_detail():
    ranks = finished_job("shape", PYCOLL_DEBUG="DETAIL")
    for r in range(RANKS):
        assert ranks[r]["error"] == "CollectiveMismatchError", ranks[r]
        assert ranks[r]["calls"] == [0, 1, 2, 3]
        assert (
            "rank 1 called all_reduce(SUM, shape=(3,), float32) at seq 2 while ranks 0,2,3 "
            "called all_reduce(SUM, shape=(4,), float32) at seq 2" in ranks[r]["message"]
        )
        assert ranks[r]["seconds"] < TIMEOUT_S  # found before anything could hang


def test_an_uncaught_timeout_shows_the_users_call_and_the_diagnosis_once(tmp_path):
    """The traceback of an uncaught pycoll error ends at the user's call (no
    pycoll frames), and each rank prints the diagnosis once. Each rank writes
    its stderr to a file of its own (ranks print at once, and the first to
    abort may cut the others short)."""
    rc, reports, err, elapsed = run_job("uncaught", STDERR_DIR=str(tmp_path))
    assert rc != 0, err
    assert elapsed < JOB_LIMIT_S
    complete = 0
    for rank in (0, 1, 3):
        path = tmp_path / str(rank)
        text = path.read_text() if path.exists() else ""
        assert not re.search(r'File "[^"]*/pycoll/', text), text  # no frame of pycoll's
        assert text.count("Traceback (most recent call last):") <= 1, text
        assert text.count(f"(timeout 1.5 s) on rank {rank}:") <= 1, text
        if "aborting the job" not in text:
            continue  # cut short by another rank's abort
        complete += 1
        # The whole report, in order: the user's call last, then the error.
        assert re.search(
            r"Traceback \(most recent call last\):\n(?:.*\n)*?"
            r'  File "[^"]*hang_scenarios\.py", line \d+, in main\n'
            r"    pycoll\.all_reduce\(x\)\n"
            r"pycoll\.errors\.DistTimeoutError: all_reduce \(seq 2\) on group "
            r"'default_pg' timed out after \d+\.\d s \(timeout 1\.5 s\) on rank "
            rf"{rank}: rank 2 has not reached seq 2\.",
            text,
        ), text
        assert text.count("uncaught DistTimeoutError; aborting the job") == 1, text
    assert complete >= 1, [(tmp_path / str(r)).read_text() for r in (0, 1, 3)]


def test_a_mismatch_is_found_at_exit_in_the_default_mode():
    """Rank 1 reduces int32 where the others reduce float32 (MPI says nothing),
    then every rank exits without destroy_process_group: the call check's last
    exchange finds it at exit, every rank says what it found, and the job
    ends with status 1 instead of 0."""
    rc, reports, err, elapsed = run_job("dtype")
    assert rc != 0, err
    assert elapsed < JOB_LIMIT_S
    for r, report in by_rank(reports).items():
        assert report["error"] is None, report  # nothing was said at the call itself
        assert (
            f"pycoll: rank {r}: CollectiveMismatchError: the ranks of group 'default_pg' called "
            f"different collectives at seq 2: ranks 0,2,3 called all_reduce(SUM, float32, "
            f"4 elements) while rank 1 called all_reduce(SUM, int32, 4 elements)." in err
        ), err


def assert_job_aborted(why: str, **env: str) -> None:
    """Run the skip scenario (rank 2 skips seq 2) with ``env``; the job must end
    at the timeout with the diagnosis and ``why`` on stderr."""
    rc, reports, err, elapsed = run_job("skip", **env)
    assert rc != 0
    assert elapsed < JOB_LIMIT_S
    assert re.search(
        r"pycoll: all_reduce \(seq 2\) on group 'default_pg' timed out after \d+\.\d s "
        r"\(timeout 1\.5 s\) on rank "
        r"[013]: rank 2 has not reached seq 2\.",
        err,
    ), err
    assert f"{why}: aborting the job" in err
    # No survivor went on to report: the job ended at the timeout.
    assert not [r for r in reports if "error" in r], reports


def test_abort_on_timeout_ends_the_job():
    assert_job_aborted("PYCOLL_ABORT_ON_TIMEOUT=1", PYCOLL_ABORT_ON_TIMEOUT="1")


def test_blocking_mode_watchdog_ends_the_job():
    """PYCOLL_WAIT=blocking: the stuck blocking all_reduce cannot raise, so the
    watchdog writes the diagnosis and aborts at the timeout."""
    assert_job_aborted("PYCOLL_WAIT=blocking", PYCOLL_WAIT="blocking")
