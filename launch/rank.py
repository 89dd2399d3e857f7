"""The rank wrapper: what the MPI launcher starts on each rank.

It reports to pycoll-run (rank, host, a free port), receives the rank's
environment (RANK, LOCAL_RANK, MASTER_ADDR...), then runs the target as a
child process that inherits the launcher's variables (so MPI initialises in
the child as if the launcher had started it). It forwards the child's output
line by line, its uncaught-exception traceback, and its exit status, and
obeys pycoll-run's orders: ``dump`` (every thread's stack: SIGUSR1 to a
Python target run through boot, SIGABRT to any other command, which Python
answers with a stack dump under PYTHONFAULTHANDLER) and ``stop``. If
pycoll-run goes away, the child is ended: no rank outlives its job.

    python .../pycoll/launch/wrap.py <target argv...>

The launcher runs wrap.py by path, which imports this file from its own
folder, not as ``pycoll.launch.rank``: importing it through the package
would import pycoll (and numpy) on every rank before the target starts, a
quarter of a second per rank for nothing.

It comes before every rank's target, so it imports only what the
interpreter has built in and the C modules behind socket, signal and
threading (``_socket``, ``_signal``, ``_thread``), and starts the target
with ``os.fork`` and ``os.execvpe``: the standard library's socket, signal,
subprocess, threading and json (with the enum, re and locale they import)
were two thirds of the wrapper's start (docs/benchmarks.md, "pycoll-run's
start-up and the test harness").
"""

from __future__ import annotations

import _socket
import _thread
import os
import sys

# typing for the type checker only, as in wire.py; signal's C module has no stub.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal
    from typing import Any, Callable, Dict, List, Optional
else:
    import _signal

if __package__:  # imported as pycoll.launch.rank (tests, tools)
    from . import wire
else:  # run by path, as the launcher does
    import wire  # type: ignore[no-redef]

ADDR_ENV, TOKEN_ENV = wire.ADDR_ENV, wire.TOKEN_ENV
RANK_VARS_ENV, TRACEBACK_FD = wire.RANK_VARS_ENV, wire.TRACEBACK_FD

STOP_GRACE_S = 3.0
DUMP_WAIT_S = 1.0  # for the stacks to be written before the child is stopped
_PR_SET_PDEATHSIG = 1  # prctl's option: a signal for this process when its parent ends


def _visible() -> Optional[List[str]]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return [d.strip() for d in visible.split(",") if d.strip()]


def _gpus_here() -> int:
    visible = _visible()
    if visible is not None:
        return len(visible)
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def _free_port() -> int:
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        s.bind(("", 0))
        return int(s.getsockname()[1])
    finally:
        s.close()


def _connect(host: str, port: int, timeout: float) -> Any:
    """A TCP connection to ``host:port``, trying each address the host
    resolves to in turn (as socket.create_connection does)."""
    error: Optional[OSError] = None
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError(f"{host} resolves to no address")


def _in_thread(func: Callable[..., None], *args: Any) -> Any:
    """Run ``func(*args)`` in a new thread; the lock returned is held until
    it returns (acquiring it joins the thread)."""
    done = _thread.allocate_lock()
    done.acquire()

    def body() -> None:
        try:
            func(*args)
        finally:
            done.release()

    _thread.start_new_thread(body, ())
    return done


def _prctl() -> Optional[Callable[..., int]]:
    """libc's prctl, on Linux (None elsewhere, or where it cannot be loaded)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _exec(
    argv: List[str], env: Dict[str, str], fds: List[int], failed: int, prctl: Any, parent: int
) -> None:  # pragma: no cover - runs in the child, between fork and exec
    """The child's side of the fork: ``fds`` as its stdin, stdout and
    stderr, the signals Python ignores back to their defaults (as
    subprocess's restore_signals), killed by the kernel if the wrapper ends
    (no rank outlives its job), then the target. If that cannot be run, the
    reason goes to ``failed``, a pipe the exec would have closed."""
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for name in ("SIGPIPE", "SIGXFSZ"):
            if hasattr(_signal, name):
                _signal.signal(getattr(_signal, name), _signal.SIG_DFL)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, _signal.SIGKILL)
            if os.getppid() != parent:  # the wrapper ended before that took hold
                os._exit(1)
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
        os.write(failed, reason.encode("utf-8", "replace"))
    finally:
        os._exit(127)


class Child:
    """The target process. The main thread reaps it (:meth:`reap`); other
    threads may signal it or wait for it meanwhile. A signal is sent only
    while it is unreaped, so never to a later process given its pid."""

    def __init__(self, pid: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self.stdout = stdout  # the read ends of its output pipes
        self.stderr = stderr
        self.code: Optional[int] = None  # as subprocess's returncode: -N for signal N
        self._guard = _thread.allocate_lock()  # held while signalling or reaping
        self._done = _thread.allocate_lock()  # held until it is reaped
        self._done.acquire()

    def reap(self) -> int:
        if hasattr(os, "waitid"):  # wait for it to end, leaving it unreaped
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        with self._guard:
            _, status = os.waitpid(self.pid, 0)
            self.code = code = os.waitstatus_to_exitcode(status)
        self._done.release()
        return code

    def wait(self, timeout: float) -> bool:
        """Whether it has ended (and been reaped) within ``timeout`` seconds."""
        if self._done.acquire(True, timeout):
            self._done.release()
            return True
        return False

    def signal(self, signum: int) -> None:
        with self._guard:
            if self.code is None:
                try:
                    os.kill(self.pid, signum)
                except ProcessLookupError:
                    pass


def spawn(argv: List[str], env: Dict[str, str], prctl: Any = None) -> Child:
    """Start ``argv`` with ``env``, stdin from /dev/null and its stdout and
    stderr piped to this process; every inheritable descriptor goes with it
    (the launcher's, such as MPICH's PMI_FD, must reach MPI in the child).
    Raises OSError with the reason if it cannot be run."""
    for fd in (0, 1, 2):  # so that no descriptor opened below is one of them
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)
    null = os.open(os.devnull, os.O_RDONLY)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    fail_r, fail_w = os.pipe()  # not inherited: a successful exec closes it
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        _exec(argv, env, [null, out_w, err_w], fail_w, prctl, parent)
    for fd in (null, out_w, err_w, fail_w):
        os.close(fd)
    reason = _read_all(fail_r)  # (nothing: the exec closed it)
    if reason:
        os.waitpid(pid, 0)
        os.close(out_r)
        os.close(err_r)
        raise OSError(reason.decode("utf-8", "replace"))
    return Child(pid, out_r, err_r)


def _read_all(fd: int) -> bytes:
    """Everything from ``fd`` to its end; then it is closed."""
    chunks: List[bytes] = []
    while True:
        data = os.read(fd, 65536)
        if not data:
            os.close(fd)
            return b"".join(chunks)
        chunks.append(data)


class Wrapper:
    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.lock = _thread.allocate_lock()
        self.child: Optional[Child] = None
        self.stopping = _thread.allocate_lock()  # taken by the first stop of the child
        self.asked_to_stop = False  # (perhaps before the child was started)
        self.booted = False  # the child runs pycoll.launch.boot (dumps on SIGUSR1)

    def send(self, message: Dict[str, Any]) -> None:
        data = wire.encode(message)
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError:
                pass  # pycoll-run is gone; the control thread ends the child

    def forward(self, fd: int, stream: int) -> None:
        lines = wire.Lines()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            for line in lines.feed(chunk):
                self.send({"t": "out", "s": stream, "line": line.decode("utf-8", "replace")})
        os.close(fd)
        rest = lines.rest()
        if rest:
            self.send({"t": "out", "s": stream, "line": rest.decode("utf-8", "replace")})

    def collect_traceback(self, fd: int) -> None:
        text = _read_all(fd)
        if text:
            self.send({"t": "exc", "text": text.decode("utf-8", "replace")})

    def control(self, reader: wire.Reader) -> None:
        """Orders from pycoll-run; its disappearance is an order to stop."""
        while True:
            try:
                messages = wire.receive(self.sock, reader)
            except OSError:
                messages = None
            if messages is None:
                self.stop()
                return
            for message in messages:
                self.obey(message)

    def obey(self, message: Dict[str, Any]) -> None:
        if message["t"] == "dump":
            self.dump()
        elif message["t"] == "stop":
            self.stop()

    def dump(self) -> None:
        child = self.child
        if child is None:
            return
        if not self.booted:
            child.signal(_signal.SIGABRT)
            return
        child.signal(_signal.SIGUSR1)
        child.wait(DUMP_WAIT_S)
        self.stop()

    def stop(self) -> None:
        self.asked_to_stop = True
        child = self.child
        if child is None or not self.stopping.acquire(False):
            return  # not started yet (main stops it once it is), or stopping already
        child.signal(_signal.SIGTERM)
        if not child.wait(STOP_GRACE_S):
            child.signal(_signal.SIGKILL)


def main(argv: List[str]) -> int:
    if not argv:
        print("usage: rank.py command [args...] (started by pycoll-run)", file=sys.stderr)
        return 2
    rank_var, _, size_var = os.environ.get(RANK_VARS_ENV, "PMI_RANK,PMI_SIZE").partition(",")
    try:
        rank = int(os.environ[rank_var])
        size = int(os.environ[size_var])
    except (KeyError, ValueError):
        print(
            f"pycoll-run's rank wrapper: {rank_var} and {size_var} are not set: was this "
            f"started by the launcher pycoll-run chose?",
            file=sys.stderr,
        )
        return 2
    host, _, port = os.environ[ADDR_ENV].rpartition(":")
    sock = _connect(host, int(port), 60.0)
    wrapper = Wrapper(sock)
    sock.sendall(wire.greeting(os.environ.get(TOKEN_ENV, "")))
    wrapper.send(
        {
            "t": "hello",
            "rank": rank,
            "size": size,
            "host": _socket.gethostname(),
            "port": _free_port(),
            "gpus": _gpus_here(),
            "visible": _visible(),
        }
    )
    prctl = _prctl()  # (while the other ranks say hello)
    reader = wire.Reader()
    sock.settimeout(None)
    setup: Optional[Dict[str, Any]] = None
    pending: List[Dict[str, Any]] = []
    while setup is None:
        batch = wire.receive(sock, reader)
        if batch is None:
            return 1  # pycoll-run ended the job before it started
        for message in batch:
            if message["t"] == "stop":
                return 1  # the job ends before this rank started
            if message["t"] == "env" and setup is None:
                setup = message
            else:
                pending.append(message)
    env = dict(os.environ)
    for key in (ADDR_ENV, TOKEN_ENV, RANK_VARS_ENV):
        env.pop(key, None)
    env.update(setup["env"])
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a Python command dumps its stacks on SIGABRT
    wrapper.booted = len(argv) > 1 and os.path.basename(argv[1]) == "boot.py"
    read_tb, write_tb = os.pipe()
    os.set_inheritable(write_tb, True)
    env[TRACEBACK_FD] = str(write_tb)

    for signum in (_signal.SIGTERM, _signal.SIGINT):  # the launcher ending the job
        _signal.signal(signum, lambda *_: _thread.start_new_thread(wrapper.stop, ()))
    try:
        child = wrapper.child = spawn(argv, env, prctl)
    except OSError as exc:
        os.close(write_tb)
        os.close(read_tb)
        wrapper.send({"t": "out", "s": 2, "line": f"cannot run {argv[0]}: {exc}"})
        wrapper.send({"t": "exit", "code": 127})
        return 127
    os.close(write_tb)
    threads = [
        _in_thread(wrapper.forward, child.stdout, 1),
        _in_thread(wrapper.forward, child.stderr, 2),
        _in_thread(wrapper.collect_traceback, read_tb),
    ]
    if wrapper.asked_to_stop:  # the launcher's signal came while it was starting
        _thread.start_new_thread(wrapper.stop, ())
    for message in pending:
        wrapper.obey(message)
    _thread.start_new_thread(wrapper.control, (reader,))
    code = child.reap()
    for done in threads:
        done.acquire()
    wrapper.send({"t": "exit", "code": code})
    try:
        sock.shutdown(_socket.SHUT_WR)
    except OSError:
        pass
    return 128 - code if code < 0 else code
