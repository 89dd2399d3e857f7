"""pycoll-run on real 4-rank jobs, under each MPI family installed here."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
from typing import List

import pytest
from launch_support import (
    HERE,
    PYTHONS,
    TARGET,
    TRANSIENT_START,
    clean_env,
    family_params,
    pycoll_run,
    reports,
    run_with_flaky_launcher,
)

from support import reaped, signals_as, still_alive

pytestmark = pytest.mark.parametrize("family", family_params())
HOST = socket.gethostname()


@pytest.fixture(autouse=True)
def one_rank(world_size):
    if world_size != 1:
        pytest.skip("launches its own jobs; runs in the single-rank pass")


def test_four_ranks_tagged_output_and_variables(family):
    proc, _ = pycoll_run(family, "-n", "4", "--env", "PYCOLL_TEST_VALUE=a b", TARGET, "ok", "x")
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():
        assert re.match(r"^\[[0-3]\] ", line), f"untagged line: {line!r}"
    seen = reports(proc.stdout)
    assert sorted(seen) == [0, 1, 2, 3]
    ports = {r["MASTER_PORT"] for r in seen.values()}
    assert len(ports) == 1 and ports.pop().isdigit()
    for rank, r in seen.items():
        assert r["mpi_size"] == 4
        assert (r["RANK"], r["WORLD_SIZE"]) == (str(rank), "4")
        assert (r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"], r["NODE_RANK"]) == (str(rank), "4", "0")
        assert r["MASTER_ADDR"] == "127.0.0.1"
        assert r["PYCOLL_TEST_VALUE"] == "a b"
        assert r["argv"] == ["ok", "x"]
        assert f"[{rank}] stderr line of {rank}" in proc.stderr.splitlines()
    assert still_alive([r["pid"] for r in seen.values()]) == []


def test_a_raising_rank_ends_the_job_with_its_traceback(family):
    proc, elapsed = pycoll_run(family, "-n", "4", TARGET, "raise", "2")
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert err.count(f"pycoll-run: rank 2 on {HOST} raised an uncaught exception:") == 1, err
    assert err.count("Traceback (most recent call last):") == 1, err
    assert "[2] Traceback (most recent call last):" in err
    assert "[2] ValueError: rank 2 refuses" in err
    assert re.search(r'\[2\]   File "[^"]*rank_target\.py", line \d+, in main', err), err
    assert "boot.py" not in err and "runpy" not in err  # the user's frames only
    seen = reports(proc.stdout)
    assert sorted(seen) == [0, 1, 2, 3]
    assert elapsed < 20, elapsed  # start-up, then the others end within seconds
    assert still_alive([r["pid"] for r in seen.values()]) == []


def test_exit_status_is_the_failing_ranks(family):
    proc, _ = pycoll_run(family, "-n", "4", TARGET, "exit", "1", "3")
    assert proc.returncode == 3, proc.stderr
    assert f"pycoll-run: rank 1 on {HOST} exited with code 3; stopping the other ranks" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert still_alive([r["pid"] for r in reports(proc.stdout).values()]) == []


def test_an_exit_of_255_shows_what_the_launcher_said(family, tmp_path):
    """255 is how an MPI library ends a process on its own error, and Open MPI
    prints the reason through its launcher: pycoll-run shows that output then
    (and only then: for other statuses it just repeats pycoll-run's note).
    Whether the launcher has said anything by the end depends on its timing,
    so the test reads what it said from --output-dir's launcher.log."""
    for status in ("255", "3"):
        out = tmp_path / status
        args = ("--output-dir", str(out), "-n", "2", TARGET, "exit", "1", status)
        proc, _ = pycoll_run(family, *args)
        assert proc.returncode == int(status), proc.stderr
        said = [line for line in (out / "launcher.log").read_text().splitlines() if line]
        shown = "pycoll-run: rank 1 raised no Python exception; the launcher said:" in proc.stderr
        assert shown == (status == "255" and bool(said)), proc.stderr
        if shown:
            assert all(f"  {line}" in proc.stderr for line in said), proc.stderr


def test_a_rank_killed_by_a_signal(family):
    proc, _ = pycoll_run(family, "-n", "3", TARGET, "kill", "2")
    assert proc.returncode == 128 + 9, proc.stderr
    assert f"pycoll-run: rank 2 on {HOST} was killed by SIGKILL; stopping the other ranks" in (
        proc.stderr
    )
    assert still_alive([r["pid"] for r in reports(proc.stdout).values()]) == []


def test_lines_are_never_cut_by_another_ranks(family):
    lines, width = 200, 5000
    proc, _ = pycoll_run(family, "-n", "4", TARGET, "spam", str(lines), str(width))
    assert proc.returncode == 0, proc.stderr
    counts = {r: 0 for r in range(4)}
    for line in proc.stdout.splitlines():
        if " REPORT " in line:
            continue
        m = re.fullmatch(r"\[(\d)\] (\d):(\d+):(\d+)", line)
        assert m and m[1] == m[2], line[:80]
        assert m[4] == m[1] * width, f"line {m[3]} of rank {m[1]} is cut or mixed"
        counts[int(m[1])] += 1
    assert counts == {r: lines for r in range(4)}


def test_timeout_dumps_every_ranks_stack_then_ends_the_job(family):
    proc, elapsed = pycoll_run(family, "-n", "4", "--timeout", "4", TARGET, "hang", "1")
    assert proc.returncode == 124, proc.stderr
    err = proc.stderr
    assert "pycoll-run: the job ran past --timeout 4 s; every rank's Python stack follows" in err
    assert re.search(r"^\[1\]   File \"[^\"]*rank_target\.py\", line \d+ in stuck_here$", err, re.M)
    for rank in range(4):  # each rank's stack, labelled with its rank
        assert re.search(rf"^\[{rank}\] (Current thread|Thread) 0x", err, re.M), err
        assert re.search(
            rf"^\[{rank}\]   File \"[^\"]*rank_target\.py\", line \d+ in main$", err, re.M
        )
    assert elapsed < 4 + 20, elapsed
    assert still_alive([r["pid"] for r in reports(proc.stdout).values()]) == []


def test_module_form(family):
    proc, _ = pycoll_run(family, "-n", "2", "-m", "rank_target", "ok", "--flag")
    assert proc.returncode == 0, proc.stderr
    seen = reports(proc.stdout)
    assert sorted(seen) == [0, 1] and seen[1]["argv"] == ["ok", "--flag"]


def test_command_form(family):
    proc, _ = pycoll_run(family, "-n", "2", "--", PYTHONS[family], TARGET, "ok")
    assert proc.returncode == 0, proc.stderr
    seen = reports(proc.stdout)
    assert sorted(seen) == [0, 1] and seen[0]["RANK"] == "0" and seen[1]["RANK"] == "1"


def test_python_and_a_script_as_with_mpirun(family):
    proc, _ = pycoll_run(family, "-n", "2", PYTHONS[family], TARGET, "ok")
    assert proc.returncode == 0, proc.stderr
    assert sorted(reports(proc.stdout)) == [0, 1]


def test_a_missing_script_is_refused_before_launching(family):
    proc, _ = pycoll_run(family, "-n", "2", "no_such_script.py")
    assert proc.returncode == 2
    assert "pycoll-run: error: no_such_script.py: no such script here, nor a command" in (
        proc.stderr
    )


def test_a_command_that_cannot_start(family):
    proc, _ = pycoll_run(family, "-n", "2", "--", "/nonexistent/program")
    assert proc.returncode == 127, proc.stderr
    assert "cannot run /nonexistent/program: No such file or directory" in proc.stderr


def test_no_tag_and_output_dir(family, tmp_path):
    logs = tmp_path / "logs"
    proc, _ = pycoll_run(family, "-n", "2", "--no-tag", "--output-dir", str(logs), TARGET, "ok")
    assert proc.returncode == 0, proc.stderr
    assert all(line.startswith("REPORT ") for line in proc.stdout.splitlines()), proc.stdout
    for rank in (0, 1):
        text = (logs / f"rank.{rank}.log").read_text()
        assert reports(text)[rank]["RANK"] == str(rank)
        assert f"stderr line of {rank}\n" in text
        assert "[" not in text.split("REPORT")[0]
    assert (logs / "launcher.log").exists()


def test_gpus_per_rank(family):
    proc, _ = pycoll_run(family, "-n", "3", "--gpus-per-rank", "2", TARGET, "ok")
    assert proc.returncode == 0, proc.stderr
    seen = reports(proc.stdout)
    assert [seen[r]["CUDA_VISIBLE_DEVICES"] for r in range(3)] == ["0,1", "2,3", "4,5"]


def test_gpus_per_rank_auto_shares_out_the_visible_devices(family):
    env = clean_env(CUDA_VISIBLE_DEVICES="4,5,6,7")  # as a scheduler would restrict them
    proc, _ = pycoll_run(family, "-n", "2", "--gpus-per-rank", "auto", TARGET, "ok", env=env)
    assert proc.returncode == 0, proc.stderr
    seen = reports(proc.stdout)
    assert [seen[r]["CUDA_VISIBLE_DEVICES"] for r in range(2)] == ["4,5", "6,7"]


def test_more_gpus_asked_than_visible_ends_the_job_before_it_starts(family):
    env = clean_env(CUDA_VISIBLE_DEVICES="0,1,2")
    proc, _ = pycoll_run(family, "-n", "2", "--gpus-per-rank", "2", TARGET, "ok", env=env)
    assert proc.returncode == 1, proc.stderr
    assert (
        f"pycoll-run: --gpus-per-rank 2: rank 1 needs 2 GPU(s) after the first 2, but {HOST} "
        f"shows 3 (CUDA_VISIBLE_DEVICES=0,1,2); ending the job"
    ) in proc.stderr
    assert reports(proc.stdout) == {}  # no rank ran the target


def _until_every_rank_reports(proc: subprocess.Popen, n: int) -> List[str]:
    """pycoll-run's output lines up to the last of ``n`` ranks' reports."""
    assert proc.stdout is not None
    lines: List[str] = []
    while len(reports("\n".join(lines))) < n:
        line = proc.stdout.readline()
        assert line, "pycoll-run ended before every rank reported"
        lines.append(line.rstrip("\n"))
    return lines


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_pycoll_run_ends_every_rank(family, signum, status):
    proc = subprocess.Popen(
        [PYTHONS[family], "-m", "pycoll.launch", "-n", "3", TARGET, "hang", "0"],
        cwd=HERE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        preexec_fn=signals_as(signal.SIG_DFL),  # (not ignored, whatever this suite's are)
    )
    with reaped(proc):
        lines = _until_every_rank_reports(proc, 3)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == status, err
    assert f"pycoll-run: {signal.Signals(signum).name}: stopping every rank" in err
    pids = [r["pid"] for r in reports("\n".join(lines) + "\n" + out).values()]
    assert still_alive(pids) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_pycoll_run_was_started_to_ignore_leaves_the_job_running(family, signum, tmp_path):
    """Started with the signal ignored (a shell's background job ignores
    SIGINT), pycoll-run goes on ignoring it, as the program it runs would."""
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [PYTHONS[family], "-m", "pycoll.launch", "-n", "2", TARGET, "wait", str(go)],
        cwd=HERE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        preexec_fn=signals_as(signal.SIG_IGN),
    )
    with reaped(proc):
        _until_every_rank_reports(proc, 2)
        proc.send_signal(signum)  # (an ignored signal is dropped as it is sent)
        go.touch()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopping every rank" not in err


def test_command_form_with_python_ends_the_job_on_a_raise_as_the_script_form(family):
    """``pycoll-run -n 3 python script.py``, as the launcher guide writes it, runs the
    script through the same exception hook as ``pycoll-run -n 3 script.py``."""
    proc, elapsed = pycoll_run(family, "-n", "3", PYTHONS[family], TARGET, "raise", "2")
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert err.count(f"pycoll-run: rank 2 on {HOST} raised an uncaught exception:") == 1, err
    assert "[2] ValueError: rank 2 refuses" in err
    assert elapsed < 20, elapsed
    assert still_alive([r["pid"] for r in reports(proc.stdout).values()]) == []


def test_a_script_after_the_double_dash_runs_with_python(family, tmp_path):
    """``-- train.py`` where train.py is not executable (as batch scripts wrote
    it) runs the script rather than failing with 'cannot run train.py'."""
    proc, _ = pycoll_run(family, "-n", "2", "--", TARGET, "ok", "x")
    assert proc.returncode == 0, proc.stderr
    seen = reports(proc.stdout)
    assert sorted(seen) == [0, 1] and seen[1]["argv"] == ["ok", "x"]


def test_the_jobs_token_is_on_no_command_line(family):
    """Every user can read argv (ps); the token that proves a connection comes
    from the job travels in the launcher's environment instead."""
    proc, _ = pycoll_run(family, "-n", "2", TARGET, "scan")
    assert proc.returncode == 0, proc.stderr
    scans = [json.loads(line.split("SCAN ", 1)[1]) for line in proc.stdout.splitlines()
             if "SCAN " in line]  # fmt: skip
    assert scans == [[], []], scans


def test_lines_that_are_not_messages_are_dropped_not_fatal(family):
    proc, _ = pycoll_run(family, "-n", "2", TARGET, "poke")
    assert proc.returncode == 0, proc.stderr
    assert sorted(reports(proc.stdout)) == [0, 1]
    assert proc.stderr.count("pycoll-run: dropped a connection that is not one of this job's") == 3
    assert "(it sent 'not a message at all')" in proc.stderr
    assert "(it sent 'pycoll-run 0123')" in proc.stderr  # a wrong token: nothing decoded


def test_a_launcher_failing_at_start_for_a_passing_reason_is_started_again(family, tmp_path):
    proc, starts = run_with_flaky_launcher(family, tmp_path, 2, TRANSIENT_START[family])
    assert proc.returncode == 0, proc.stderr
    assert starts == 3
    assert sorted(reports(proc.stdout)) == [0, 1]
    for attempt in (2, 3):
        assert (
            f"pycoll-run: the launcher exited with code 213 at start-up, before any rank "
            f"started; starting it again ({attempt} of 3). It said:" in proc.stderr
        ), proc.stderr
    assert TRANSIENT_START[family].split("\n")[0] in proc.stderr


def test_a_launcher_that_keeps_failing_at_start_is_given_up_after_three_starts(family, tmp_path):
    proc, starts = run_with_flaky_launcher(family, tmp_path, 5, TRANSIENT_START[family])
    assert proc.returncode == 213, proc.stderr
    assert starts == 3
    assert "starting it again (3 of 3)" in proc.stderr
    assert "exited with code 213 before any rank started. It said:" in proc.stderr


def test_other_start_failures_are_not_retried(family, tmp_path):
    proc, starts = run_with_flaky_launcher(family, tmp_path, 1, "no such host: nowhere")
    assert proc.returncode == 213, proc.stderr
    assert starts == 1
    assert "starting it again" not in proc.stderr
    assert "before any rank started. It said:\n  no such host: nowhere" in proc.stderr
