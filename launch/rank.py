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

    python .../pycoll/launch/rank.py <target argv...>

The launcher runs this file by path, not as ``pycoll.launch.rank``: importing
it through the package would import pycoll (and numpy) on every rank before
the target starts, a quarter of a second per rank for nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading

TYPE_CHECKING = False  # typing for the type checker only, as in wire.py
if TYPE_CHECKING:
    from typing import IO, Any, Dict, List, Optional

if __package__:  # imported as pycoll.launch.rank (tests, tools)
    from . import wire
else:  # run by path, as the launcher does
    import wire  # type: ignore[no-redef]

ADDR_ENV, TOKEN_ENV = wire.ADDR_ENV, wire.TOKEN_ENV
RANK_VARS_ENV, TRACEBACK_FD = wire.RANK_VARS_ENV, wire.TRACEBACK_FD

STOP_GRACE_S = 3.0
DUMP_WAIT_S = 1.0  # for the stacks to be written before the child is stopped


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: killed if the wrapper dies
    except (OSError, AttributeError):
        pass


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
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class Wrapper:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.child: Optional[subprocess.Popen] = None
        self.stopping = threading.Event()
        self.booted = False  # the child runs pycoll.launch.boot (dumps on SIGUSR1)

    def send(self, message: Dict[str, Any]) -> None:
        data = wire.encode(message)
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError:
                pass  # pycoll-run is gone; the control thread ends the child

    def forward(self, pipe: IO[bytes], stream: int) -> None:
        reader = wire.Reader(raw=True)
        for chunk in iter(lambda: pipe.read1(65536), b""):  # type: ignore[attr-defined]
            for line in reader.feed(chunk):
                self.send({"t": "out", "s": stream, "line": line.decode("utf-8", "replace")})
        rest = reader.rest()
        if rest:
            self.send({"t": "out", "s": stream, "line": rest.decode("utf-8", "replace")})

    def collect_traceback(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            text = pipe.read()
        if text:
            self.send({"t": "exc", "text": text.decode("utf-8", "replace")})

    def control(self, reader: wire.Reader) -> None:
        """Orders from pycoll-run; its disappearance is an order to stop."""
        while True:
            try:
                messages = list(wire.receive(self.sock, reader))
            except OSError:
                messages = []
            if not messages:
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
        if not self.booted:
            self.signal(signal.SIGABRT)
            return
        self.signal(signal.SIGUSR1)
        child = self.child
        if child is not None:
            try:
                child.wait(DUMP_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        self.stop()

    def signal(self, signum: int) -> None:
        child = self.child
        if child is not None and child.poll() is None:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        self.signal(signal.SIGTERM)
        child = self.child
        if child is not None:
            try:
                child.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()


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
    sock = socket.create_connection((host, int(port)), timeout=60)
    wrapper = Wrapper(sock)
    wrapper.send(
        {
            "t": "hello",
            "token": os.environ.get(TOKEN_ENV, ""),
            "rank": rank,
            "size": size,
            "host": socket.gethostname(),
            "port": _free_port(),
            "gpus": _gpus_here(),
            "visible": _visible(),
        }
    )
    reader = wire.Reader()
    sock.settimeout(None)
    setup: Optional[Dict[str, Any]] = None
    pending: List[Dict[str, Any]] = []
    while setup is None:
        batch = list(wire.receive(sock, reader))
        if not batch:
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

    for signum in (signal.SIGTERM, signal.SIGINT):  # the launcher ending the job
        signal.signal(signum, lambda *_: threading.Thread(target=wrapper.stop).start())
    try:
        wrapper.child = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Inherit every inheritable descriptor: the launcher's (MPICH's
            # PMI_FD) must reach MPI in the child, and so must write_tb.
            close_fds=False,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    except OSError as exc:
        os.close(write_tb)
        os.close(read_tb)
        wrapper.send({"t": "out", "s": 2, "line": f"cannot run {argv[0]}: {exc.strerror}"})
        wrapper.send({"t": "exit", "code": 127})
        return 127
    os.close(write_tb)
    child = wrapper.child
    assert child.stdout is not None and child.stderr is not None
    threads = [
        threading.Thread(target=wrapper.forward, args=(child.stdout, 1)),
        threading.Thread(target=wrapper.forward, args=(child.stderr, 2)),
        threading.Thread(target=wrapper.collect_traceback, args=(read_tb,)),
    ]
    for t in threads:
        t.start()
    for message in pending:
        wrapper.obey(message)
    threading.Thread(target=wrapper.control, args=(reader,), daemon=True).start()
    code = child.wait()
    for t in threads:
        t.join()
    wrapper.send({"t": "exit", "code": code})
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    wire.exit_now(main(sys.argv[1:]))
