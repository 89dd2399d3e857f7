"""pycoll-run's side of a job: start the MPI launcher, hear from every rank,
print their output, and end the job the moment something goes wrong.

The launcher runs in its own session with its output captured; every rank's
wrapper connects back over TCP. That one channel carries each rank's output
(printed whole-line, tagged with the rank), its uncaught traceback, and its
exit status, and lets pycoll-run order a stack dump or a stop. The first
rank that fails decides the exit status; the others are stopped within
seconds rather than left in a collective until the wall-clock limit.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO, Any, Callable, Dict, List, Optional, Tuple

from . import wire
from .families import Family, Job
from .wire import ADDR_ENV, RANK_VARS_ENV, TOKEN_ENV

STOP_GRACE_S = 5.0  # from "stop" to killing the launcher
EXIT_GRACE_S = 1.0  # after a plain non-zero exit, for ranks finishing the same way
MPI_EXIT = 255  # exit(-1): how MPI libraries end a process on an error of their own
DUMP_GRACE_S = 5.0  # from "dump" to "stop"
EXIT_TIMEOUT = 124
EXIT_START = 1
START_ATTEMPTS = 3  # launcher starts, when it fails at start-up for a passing reason


@dataclass
class Options:
    """How pycoll-run supervises a job (the command line's choices)."""

    tag: bool = True
    # Tag with the host too ([3@node2]): the ranks run on more hosts than this one.
    tag_host: bool = False
    output_dir: Optional[str] = None
    timeout: Optional[float] = None
    start_timeout: float = 120.0
    gpus_per_rank: Optional[str] = None  # "N" or "auto"
    advertise: str = "127.0.0.1"  # the address ranks reach pycoll-run at
    # Where output goes instead of stdout/stderr: sink(rank or None, stream,
    # line). pycoll.testing collects a job's output this way.
    sink: Optional[Callable[[Optional[int], int, str], None]] = None
    # A moving time limit: called often, returns a time.monotonic() deadline
    # (or None); pycoll.testing gives each test of a job its own timeout so.
    deadline: Optional[Callable[[], Optional[float]]] = None


class RankState:
    """What pycoll-run knows of one rank."""

    def __init__(
        self, rank: int, conn: socket.socket, reader: wire.Reader, host: str, port: int
    ) -> None:
        self.rank = rank
        self.conn = conn
        self.reader = reader
        self.host = host
        self.port = port
        self.gpus = 0
        self.visible: Optional[List[str]] = None  # the host's CUDA_VISIBLE_DEVICES, if set
        self.exit_code: Optional[int] = None
        self.log: Optional[IO[str]] = None


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def describe_exit(code: int) -> str:
    """'was killed by SIGSEGV' or 'exited with code 3', from a raw exit code."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


class Supervisor:
    def __init__(self, family: Family, launcher: str, job: Job, options: Options) -> None:
        self.family = family
        self.launcher = launcher
        self.job = job
        self.options = options
        self.n = job.nprocs
        self.ranks: Dict[int, RankState] = {}
        self.conns: Dict[socket.socket, RankState] = {}
        self.unknown: Dict[socket.socket, wire.Reader] = {}  # connected, no hello yet
        self.sel = selectors.DefaultSelector()
        self.token = os.urandom(16).hex()  # (as secrets.token_hex, without its imports)
        self.failure: Optional[Tuple[int, int]] = None  # (rank, raw exit code)
        self.reported: set = set()
        self.stop_at: Optional[float] = None  # when to order every rank to stop
        self.kill_at: Optional[float] = None  # when to kill the launcher itself
        self.interrupted: Optional[int] = None
        self.timed_out = False
        self.started = False
        self.launcher_log: List[str] = []
        self.out_dir = options.output_dir or None
        self.drain_until: Optional[float] = None
        self.began = 0.0  # when run() started the launcher first
        self.accepted = 0  # connections taken (a rank's wrapper ran)

    # -- output ---------------------------------------------------------------

    def emit(self, rank: Optional[int], stream: int, line: str) -> None:
        if self.options.sink is not None:
            self.options.sink(rank, stream, line)
        else:
            self._print(rank, stream, line)
        state = self.ranks.get(rank) if rank is not None else None
        if state is not None and state.log is not None:
            state.log.write(line + "\n")
            state.log.flush()

    def _print(self, rank: Optional[int], stream: int, line: str) -> None:
        prefix = ""
        if rank is not None and self.options.tag:
            state = self.ranks.get(rank)
            if self.options.tag_host and state is not None:
                prefix = f"[{rank}@{state.host.split('.')[0]}] "
            else:
                prefix = f"[{rank}] "
        out = sys.stdout if stream == 1 else sys.stderr
        try:
            out.write(f"{prefix}{line}\n")
            out.flush()
        except (BrokenPipeError, ValueError):
            # The reader went away (| head): keep supervising, print no more there.
            devnull = open(os.devnull, "w")
            if stream == 1:
                sys.stdout = devnull
            else:
                sys.stderr = devnull

    def note(self, text: str) -> None:
        self.emit(None, 2, f"pycoll-run: {text}")

    # -- the job --------------------------------------------------------------

    def launch_env(self, listener: socket.socket) -> Dict[str, str]:
        port = listener.getsockname()[1]
        env = dict(os.environ)
        for key, value in self.family.defaults().items():
            env.setdefault(key, value)
        env.update(self.job.env)
        env[ADDR_ENV] = f"{self.options.advertise}:{port}"
        env[TOKEN_ENV] = self.token
        env[RANK_VARS_ENV] = self.family.rank_vars
        return env

    def run(self) -> int:
        """Run the job to its end; the exit status pycoll-run returns.

        A launcher that fails at start-up for a passing reason its family
        knows (a socket of its own it could not open), before any rank
        connected, is started again, at most ``START_ATTEMPTS`` times in all:
        nothing of the job has run, so nothing runs twice.
        """
        if self.out_dir is not None:
            os.makedirs(self.out_dir, exist_ok=True)
        self.began = time.monotonic()
        for attempt in range(1, START_ATTEMPTS + 1):
            code = self._launch()
            if code is None:
                return 127
            said = "\n".join(self.launcher_log)
            if (
                attempt == START_ATTEMPTS
                or code == 0
                or self.accepted
                or self.failure is not None  # (the start timeout, say: the job was ended)
                or self.kill_at is not None
                or self.interrupted is not None
                or self.timed_out
                or not self.family.transient_start_failure(said)
            ):
                return self._status(code)
            self.note(
                f"the launcher {describe_exit(code)} at start-up, before any rank "
                f"started; starting it again ({attempt + 1} of {START_ATTEMPTS}). It said:"
            )
            self._dump_launcher_log()
            self.launcher_log = []
        raise AssertionError("unreachable")

    def _launch(self) -> Optional[int]:
        """Start the launcher once and supervise it to its end; its raw exit
        code (None: it could not be started)."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1" if self.options.advertise == "127.0.0.1" else "", 0))
        listener.listen(max(self.n, 128))
        env = self.launch_env(listener)
        for key in (ADDR_ENV, RANK_VARS_ENV):  # on the command line: remote ranks
            self.job.env[key] = env[key]
        # The token proves a connection comes from this job: it travels in the
        # launcher's environment, named on its command line, never written
        # there (argv is visible to every user of the machine through ps).
        self.job.forward = [TOKEN_ENV]
        command = self.family.command(self.launcher, self.job)
        try:
            proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches pycoll-run, which ends the job
            )
        except OSError as exc:
            self.note(f"cannot start {command[0]}: {exc.strerror}")
            listener.close()
            return None
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        launcher_reader = wire.Lines()
        self.sel.register(listener, selectors.EVENT_READ, "listen")
        self.sel.register(proc.stdout, selectors.EVENT_READ, "launcher")
        # Ctrl-C and SIGTERM stop the job, unless this process was started to
        # ignore them (a shell's background job ignores SIGINT): those stay
        # ignored, as they do for the rest of the program (a pytest session
        # must not lose its job to a signal it then goes on past).
        old = {
            s: signal.signal(s, self._on_signal)
            for s in (signal.SIGINT, signal.SIGTERM)
            if signal.getsignal(s) is not signal.SIG_IGN
        }
        start = self.began  # --timeout and the start timeout count from the first start
        launcher_open = True
        launcher_gone: Optional[float] = None  # when the launcher itself exited
        try:
            while launcher_open or self._waiting_for_ranks(proc):
                now = time.monotonic()
                self._check_deadlines(now, start, proc)
                if launcher_open and launcher_gone is None and proc.poll() is not None:
                    launcher_gone = now
                if launcher_open and launcher_gone is not None and now - launcher_gone > 2.0:
                    # The launcher has exited but something it started still
                    # holds its output open (Open MPI's ssh to a node cut
                    # off from the network): end those, and stop waiting.
                    self._kill_session(proc.pid)
                    self.sel.unregister(proc.stdout)
                    launcher_open = False
                # Once the launcher's output has closed, it is about to exit:
                # look again soon (a 0.2 s select here was most of pycoll-run's
                # own start-and-exit cost).
                for event, _ in self.sel.select(timeout=0.2 if launcher_open else 0.005):
                    if event.data == "listen":
                        conn, _ = listener.accept()
                        self.accepted += 1
                        conn.setblocking(False)
                        self.unknown[conn] = wire.Reader(self.token)
                        self.sel.register(conn, selectors.EVENT_READ, "rank")
                    elif event.data == "launcher":
                        data = os.read(proc.stdout.fileno(), 65536)
                        if not data:
                            self.sel.unregister(proc.stdout)
                            launcher_open = False
                            rest = launcher_reader.rest()
                            if rest:
                                self.launcher_log.append(rest.decode("utf-8", "replace"))
                        for line in launcher_reader.feed(data):
                            self.launcher_log.append(line.decode("utf-8", "replace"))
                    else:
                        self._read_rank(event.fileobj)  # type: ignore[arg-type]
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
            self._kill_launcher(proc)
            for conn in [*self.conns, *self.unknown]:
                self.sel.unregister(conn)
                conn.close()
            self.conns.clear()
            self.unknown.clear()
            self.sel.unregister(listener)
            if launcher_open:
                self.sel.unregister(proc.stdout)
            listener.close()
            self._write_launcher_log()
        code = proc.wait()
        proc.stdout.close()
        return code

    def _waiting_for_ranks(self, proc: subprocess.Popen) -> bool:
        """After the launcher ended: connections still draining, briefly."""
        if proc.poll() is None:
            return True
        if not self.conns:
            return False
        if self.drain_until is None:
            self.drain_until = time.monotonic() + 2.0
        return time.monotonic() < self.drain_until

    def _check_deadlines(self, now: float, start: float, proc: subprocess.Popen) -> None:
        if self.interrupted is not None and self.kill_at is None:
            self.note(f"{signal.Signals(self.interrupted).name}: stopping every rank")
            self._stop_all(now)
        if not self.started and self.kill_at is None and now - start > self.options.start_timeout:
            missing = sorted(set(range(self.n)) - set(self.ranks))
            self.note(
                f"ranks {','.join(map(str, missing))} did not start within "
                f"{self.options.start_timeout:g} s; ending the job. The launcher said:"
            )
            self._dump_launcher_log()
            self.failure = self.failure or (missing[0] if missing else 0, EXIT_START)
            self._stop_all(now)
        timeout = self.options.timeout
        limit = None if timeout is None else start + timeout
        moving = self.options.deadline() if self.options.deadline is not None else None
        if moving is not None and (limit is None or moving < limit):
            limit = moving
        if limit is not None and not self.timed_out and now > limit:
            self.timed_out = True
            if self.kill_at is None:
                why = (
                    f"the job ran past --timeout {timeout:g} s"
                    if moving is None or limit != moving
                    else "the job ran past its time limit"
                )
                self.note(f"{why}; every rank's Python stack follows")
                self._broadcast({"t": "dump"})  # each wrapper has faulthandler print
                self.stop_at = now + DUMP_GRACE_S
        if self.stop_at is not None and now >= self.stop_at:
            self._stop_all(now)
        if self.kill_at is not None and now >= self.kill_at:
            self._kill_launcher(proc)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.interrupted = signum

    @staticmethod
    def _send(state: RankState, message: Dict[str, Any]) -> None:
        """One message to one wrapper, whole (its socket is otherwise non-blocking)."""
        state.conn.setblocking(True)
        try:
            state.conn.sendall(wire.encode(message))
        finally:
            state.conn.setblocking(False)

    def _broadcast(self, message: Dict[str, Any]) -> None:
        for state in self.ranks.values():
            if state.exit_code is None:
                try:
                    self._send(state, message)
                except OSError:
                    pass

    def _stop_all(self, now: float) -> None:
        if self.kill_at is None:
            self.stop_at = None
            self.kill_at = now + STOP_GRACE_S
            self._broadcast({"t": "stop"})

    def _kill_launcher(self, proc: subprocess.Popen) -> None:
        if proc.poll() is not None:
            self._kill_session(proc.pid)
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(3)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._kill_session(proc.pid)

    @staticmethod
    def _kill_session(sid: int) -> None:
        """SIGKILL what is left in the launcher's session (it leads one of its
        own): processes it put in other process groups, such as the ssh
        clients Open MPI starts to other nodes, which outlive it when the
        node they reach is cut off. Linux (/proc) only; elsewhere nothing."""
        try:
            entries = os.listdir("/proc")
        except OSError:
            return
        for entry in entries:
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
                # Field 6, counted after the command's closing parenthesis.
                if int(stat[stat.rindex(b")") + 2 :].split()[3]) == sid:
                    os.kill(int(entry), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                continue

    def _read_rank(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        state = self.conns.get(conn)
        if not data:
            self._drop(conn)
            if state is not None and state.exit_code is None:
                # The wrapper vanished without a word (killed by the launcher).
                self._on_exit(state, -signal.SIGKILL, silent=self.kill_at is not None)
            return
        if state is None:
            reader = self.unknown[conn]
            for message in reader.feed(data):
                if state is not None:
                    self._on_message(state, message)
                elif message["t"] == "hello":  # (after the job's token: wire.Reader)
                    del self.unknown[conn]
                    state = self._on_hello(conn, message, reader)
                else:  # not one of this job's ranks: never fatal, said once
                    self.note(
                        f"dropped a connection that is not one of this job's ranks "
                        f"(it sent {str(message.get('line', message))[:60]!r})"
                    )
                    self._drop(conn)
                    return
            return
        for message in state.reader.feed(data):
            self._on_message(state, message)

    def _drop(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        self.conns.pop(conn, None)
        self.unknown.pop(conn, None)
        conn.close()

    def _on_hello(
        self, conn: socket.socket, hello: Dict[str, Any], reader: wire.Reader
    ) -> RankState:
        rank = int(hello["rank"])
        state = RankState(rank, conn, reader, hello["host"], int(hello["port"]))
        state.gpus = int(hello.get("gpus", 0))
        state.visible = hello.get("visible")
        if self.out_dir is not None:
            state.log = open(os.path.join(self.out_dir, f"rank.{rank}.log"), "w")
        self.ranks[rank] = state
        self.conns[conn] = state
        if int(hello["size"]) != self.n:
            self.note(
                f"rank {rank} reports a world of {hello['size']} ranks, not {self.n}: "
                f"the launcher did not start the job asked for"
            )
        if len(self.ranks) == self.n and not self.started:
            self.started = True
            try:
                envs = {r: self.rank_env(r) for r in self.ranks}
            except ValueError as exc:
                self.note(f"{exc}; ending the job")
                self.failure = (rank, EXIT_START)
                self._stop_all(time.monotonic())
                return state
            for state_ in self.ranks.values():
                self._send(state_, {"t": "env", "env": envs[state_.rank]})
            if self.kill_at is not None:
                self._broadcast({"t": "stop"})
        return state

    def rank_env(self, rank: int) -> Dict[str, str]:
        """RANK, LOCAL_RANK... as torchrun sets them, from where ranks landed."""
        order = sorted(self.ranks)
        hosts: List[str] = []
        for r in order:
            if self.ranks[r].host not in hosts:
                hosts.append(self.ranks[r].host)
        me = self.ranks[rank]
        local = [r for r in order if self.ranks[r].host == me.host]
        zero = self.ranks[order[0]]
        env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(self.n),
            "LOCAL_RANK": str(local.index(rank)),
            "LOCAL_WORLD_SIZE": str(len(local)),
            "NODE_RANK": str(hosts.index(me.host)),
            "GROUP_RANK": str(hosts.index(me.host)),
            "MASTER_ADDR": os.environ.get(
                "MASTER_ADDR", "127.0.0.1" if len(hosts) == 1 else zero.host
            ),
            "MASTER_PORT": os.environ.get("MASTER_PORT", str(zero.port)),
        }
        gpus = self.options.gpus_per_rank
        if gpus is not None:
            per = int(gpus) if gpus != "auto" else me.gpus // len(local)
            if per > 0:
                # Indices into what the host lets this job see (a scheduler may
                # already have narrowed CUDA_VISIBLE_DEVICES), else from 0.
                visible = me.visible
                ids = visible if visible is not None else [str(i) for i in range(per * len(local))]
                first = local.index(rank) * per
                if first + per > len(ids):
                    raise ValueError(
                        f"--gpus-per-rank {gpus}: rank {rank} needs {per} GPU(s) after the "
                        f"first {first}, but {me.host} shows {len(ids)} "
                        f"(CUDA_VISIBLE_DEVICES={','.join(ids)})"
                    )
                env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[first : first + per])
        return env

    def _on_message(self, state: RankState, message: Dict[str, Any]) -> None:
        kind = message["t"]
        if kind == wire.MALFORMED:
            self.note(f"ignored a malformed message from rank {state.rank}: {message['line']!r}")
        elif kind == "out":
            self.emit(state.rank, int(message["s"]), message["line"])
        elif kind == "exc":
            if state.rank not in self.reported:
                self.reported.add(state.rank)
                self.note(f"rank {state.rank} on {state.host} raised an uncaught exception:")
                for line in message["text"].rstrip("\n").split("\n"):
                    self.emit(state.rank, 2, line)
        elif kind == "exit":
            self._on_exit(state, int(message["code"]))

    def _on_exit(self, state: RankState, code: int, silent: bool = False) -> None:
        state.exit_code = code
        if state.log is not None:
            state.log.close()
            state.log = None
        if code == 0 or self.timed_out or self.interrupted is not None:
            return
        if self.failure is None:
            self.failure = (state.rank, code)
            if not silent:
                self.note(
                    f"rank {state.rank} on {state.host} {describe_exit(code)}; "
                    f"stopping the other ranks"
                )
            now = time.monotonic()
            if code > 0 and state.rank not in self.reported and self.kill_at is None:
                # A plain exit(1): the others may be ending the same way (pytest
                # in place prints its summary on rank 0 last); give them a moment.
                self.stop_at = now + EXIT_GRACE_S if self.stop_at is None else self.stop_at
            else:
                self._stop_all(now)

    def _dump_launcher_log(self) -> None:
        for line in self.launcher_log:
            self.emit(None, 2, f"  {line}")

    def _write_launcher_log(self) -> None:
        if self.out_dir is not None:
            with open(os.path.join(self.out_dir, "launcher.log"), "w") as f:
                f.write("".join(line + "\n" for line in self.launcher_log))

    def _status(self, launcher_code: int) -> int:
        if self.interrupted is not None:
            return 128 + self.interrupted
        if self.timed_out:
            return EXIT_TIMEOUT
        if self.failure is not None:
            rank, code = self.failure
            never = [r for r in range(self.n) if r not in self.ranks]
            if never and self.launcher_log:
                # Ranks that never started (a host the launcher could not reach:
                # it may kill the ranks it did start before it exits): its
                # output is the only account of why.
                self.note(f"ranks {','.join(map(str, never))} never started; the launcher said:")
                self._dump_launcher_log()
            elif code == MPI_EXIT and rank not in self.reported and self.launcher_log:
                # No Python traceback, and the status MPI libraries exit with when
                # they end a process themselves: their message may have gone to
                # the launcher (Open MPI's does), whose output is otherwise kept
                # back (it only repeats what pycoll-run says).
                self.note(f"rank {rank} raised no Python exception; the launcher said:")
                self._dump_launcher_log()
            return _exit_status(code)
        missing = [
            r for r in range(self.n) if r not in self.ranks or self.ranks[r].exit_code is None
        ]
        if launcher_code != 0 or missing:
            if not self.ranks:
                self.note(
                    f"the launcher {self.launcher} {describe_exit(launcher_code)} before any "
                    f"rank started. It said:"
                )
            else:
                self.note(
                    f"the launcher {describe_exit(launcher_code)}"
                    + (f"; ranks {','.join(map(str, missing))} never reported" if missing else "")
                    + ". It said:"
                )
            self._dump_launcher_log()
            return _exit_status(launcher_code) or 1
        return 0
