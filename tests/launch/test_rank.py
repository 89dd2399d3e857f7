"""pycoll.launch.rank's child process: started with os.fork and os.execvpe
(not subprocess, whose imports were most of the wrapper's start), so what
subprocess.Popen did for it is checked here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from pycoll.launch import rank
from support import still_alive


@pytest.fixture(autouse=True)
def one_rank(world_size):
    if world_size != 1:
        pytest.skip("forks processes; runs in the single-rank pass")


def _sh(script, env=None):
    return rank.spawn(["sh", "-c", script], dict(os.environ if env is None else env))


def _read(fd):
    return rank._read_all(fd).decode()


def test_output_exit_code_and_environment():
    child = _sh('echo "out $PYCOLL_X"; echo err >&2; exit 3', {**os.environ, "PYCOLL_X": "y"})
    assert _read(child.stdout) == "out y\n"
    assert _read(child.stderr) == "err\n"
    assert child.reap() == 3
    assert child.code == 3


def test_a_signal_death_is_minus_the_signal():
    child = _sh("kill -9 $$")
    assert child.reap() == -signal.SIGKILL


def test_a_command_that_cannot_run_raises_with_the_reason():
    with pytest.raises(OSError, match="No such file or directory"):
        rank.spawn(["/nonexistent/pycoll-command"], dict(os.environ))
    with pytest.raises(OSError, match="No such file or directory"):
        rank.spawn(["pycoll-no-such-command"], {"PATH": "/usr/bin:/bin"})  # searched on PATH


def test_stdin_is_empty_and_only_inheritable_descriptors_reach_the_child():
    keep_r, keep_w = os.pipe()
    shut_r, shut_w = os.pipe()  # not inheritable, as every descriptor Python opens
    os.set_inheritable(keep_w, True)
    try:
        check = textwrap.dedent(f"""
            import os
            print(os.readlink("/proc/self/fd/0"))
            os.write({keep_w}, b"kept\\n")
            try:
                os.fstat({shut_w})
                print("open")
            except OSError:
                print("closed")
        """)
        child = rank.spawn([sys.executable, "-S", "-c", check], dict(os.environ))
    finally:
        os.close(keep_w)
        os.close(shut_w)
    assert _read(child.stdout) == "/dev/null\nclosed\n"
    assert child.reap() == 0
    assert _read(keep_r) == "kept\n"
    os.close(shut_r)


def test_the_signals_python_ignores_are_back_to_their_defaults():
    # Python ignores SIGPIPE (and SIGXFSZ); a child must not inherit that.
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN
    child = _sh("grep SigIgn /proc/self/status")
    ignored = int(_read(child.stdout).split()[1], 16)
    child.reap()
    assert ignored & (1 << (signal.SIGPIPE - 1)) == 0
    assert ignored & (1 << (signal.SIGXFSZ - 1)) == 0


def test_wait_signal_and_reap_from_several_threads():
    child = _sh("sleep 30")
    assert not child.wait(0.05)
    child.signal(signal.SIGTERM)
    assert child.reap() == -signal.SIGTERM
    assert child.wait(0)
    child.signal(signal.SIGTERM)  # reaped: signals nothing, raises nothing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_the_child_dies_with_the_wrapper():
    # A wrapper killed by the launcher (SIGKILL: no handler runs) leaves no target.
    wrapper = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import os, signal, sys
            from pycoll.launch import rank
            child = rank.spawn(["sleep", "60"], dict(os.environ), rank._prctl())
            print(child.pid, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    pid = int(wrapper.stdout.readline())
    assert wrapper.wait(60) == -signal.SIGKILL
    assert still_alive([pid]) == []
