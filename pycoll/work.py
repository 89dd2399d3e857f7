"""Work (a handle on an operation in flight) and Future.

An ``async_op=True`` call starts a real nonblocking MPI operation and returns
a Work at once; the data is only valid after ``wait()`` (or once
``is_completed()`` is True). Anything pycoll does after MPI finishes (the
division of an AVG, unpacking a list of outputs) runs when the Work is
observed complete, in the thread that observed it.

Both forms start the same nonblocking MPI operation (see pycoll.watch), so
one rank may call a collective with ``async_op=True`` while another calls
it without. ``wait()`` is bounded by the group's timeout unless given one.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional

from . import _mpi, debug, watch
from .errors import DistBackendError
from .trace import recorder

__all__ = ["AliasWork", "BaseWork", "Work", "Future"]


class Future:
    """The eventual value of an operation, as torch.futures.Future.

    A Future made by :meth:`Work.get_future` completes when its Work does;
    waiting on it drives the Work. A Future made by the user completes when
    the user calls :meth:`set_result` or :meth:`set_exception`.

    Callbacks run in the thread that completes the future, unless the maker
    gave a ``_runner`` (pycoll.rpc's progress thread hands them to its worker
    pool: ``_runner(callback, future)``); ``then``'s futures inherit it.
    """

    def __init__(
        self,
        _driver: Any = None,  # a BaseWork, or anything with wait() and is_completed()
        _runner: Optional[Callable[[Callable[[Future], Any], Future], None]] = None,
    ) -> None:
        self._driver = _driver
        self._runner = _runner
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._value: Any = None
        self._exc: Optional[BaseException] = None
        self._callbacks: List[Callable[[Future], None]] = []

    def done(self) -> bool:
        """True when the value (or an exception) is set."""
        if not self._event.is_set() and self._driver is not None:
            self._driver.is_completed()
        return self._event.is_set()

    def wait(self) -> Any:
        """Block until complete; return the value or raise the exception."""
        if not self._event.is_set() and self._driver is not None:
            try:
                self._driver.wait()
            except Exception:
                pass  # the Work completed this future with its exception
        self._event.wait()
        try:
            return self.value()
        finally:
            del self  # the raised exception's frames must not hold the future (a cycle)

    def value(self) -> Any:
        """The value of a completed future (raises its exception if it has one)."""
        if not self._event.is_set():
            raise RuntimeError(
                "Future.value() called before the future completed; call wait() first"
            )
        try:
            if self._exc is not None:
                raise self._exc
            return self._value
        finally:
            # Break the cycle future -> exception -> traceback -> this frame ->
            # future, which would keep everything the traceback's frames hold
            # (an RRef, big arrays) alive until the cyclic collector runs.
            del self

    def then(self, callback: Callable[[Future], Any]) -> Future:
        """A new Future holding ``callback(self)``, run once this one completes.

        An exception raised by the callback becomes the new Future's exception.
        """
        child = Future(self._driver, self._runner)

        def run(parent: Future) -> None:
            try:
                child.set_result(callback(parent))
            except Exception as exc:  # handed to whoever waits on child
                child.set_exception(exc)

        self._add_callback(run)
        return child

    def add_done_callback(self, callback: Callable[[Future], None]) -> None:
        """Run ``callback(self)`` once complete (at once if already complete)."""
        self._add_callback(callback)

    def set_result(self, result: Any) -> None:
        """Complete the future with ``result``."""
        self._complete(result, None)

    def set_exception(self, exc: BaseException) -> None:
        """Complete the future with an exception, raised by wait() and value()."""
        if not isinstance(exc, BaseException):
            raise TypeError(f"set_exception needs an exception, got {type(exc).__name__}")
        self._complete(None, exc)

    def _add_callback(self, callback: Callable[[Future], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def _complete(self, value: Any, exc: Optional[BaseException]) -> None:
        with self._lock:
            if self._event.is_set():
                raise RuntimeError(
                    "Future is already completed; set_result/set_exception may be called once"
                )
            self._value, self._exc = value, exc
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            if self._runner is None:
                cb(self)
            else:
                self._runner(cb, self)


class BaseWork:
    """The one Work protocol, which every kind of work implements: ``wait(timeout)``,
    ``is_completed()``, ``is_success()``, ``exception()``, ``result()``,
    ``get_future()`` and ``source_rank()``, as torch.distributed's Work.

    A kind of work (MPI's, Work; a call made on stand-ins for the caller's
    arrays, AliasWork; NCCL's, pycoll.gpu.nccl) implements ``wait``,
    ``is_completed``, ``exception`` and ``_value`` (its outputs, once
    complete), and calls
    ``_settle_future()`` once it has completed; the rest is shared here.

    Attributes:
        op: the operation's name, e.g. ``"all_reduce"``.
        seq: its sequence number on the group (None for point-to-point).
    """

    __slots__ = ("op", "seq", "_future")

    op: str
    seq: Optional[int]
    _future: Optional[Future]

    def wait(self, timeout: Optional[float] = None) -> bool:  # pragma: no cover - abstract
        """Block until the operation completes (at most ``timeout`` seconds, or
        the group's timeout); return True, or raise its error."""
        raise NotImplementedError

    def is_completed(self) -> bool:  # pragma: no cover - abstract
        """True once the operation has completed (successfully or not). Never blocks."""
        raise NotImplementedError

    def exception(self) -> Optional[BaseException]:  # pragma: no cover - abstract
        """The error the operation failed with, or None."""
        raise NotImplementedError

    def _value(self) -> List[Any]:  # pragma: no cover - abstract
        """The operation's outputs, once it has completed."""
        raise NotImplementedError

    def is_success(self) -> bool:
        """True once completed without error."""
        return self.is_completed() and self.exception() is None

    def result(self) -> List[Any]:
        """Wait for completion and return the operation's output arrays."""
        self.wait()
        return self._value()

    def source_rank(self) -> int:
        """For a completed receive from any source: the global rank it came from."""
        self.wait()
        raise RuntimeError(f"source_rank() applies to receives, not to {self.op}")

    def get_future(self) -> Future:
        """A Future that completes, with ``result()``, when this work does."""
        future = self._future
        if future is None:
            future = self._future = Future(self)
            if self.is_completed():
                self._settle_future()
        return future

    def _settle_future(self) -> None:
        """Complete the Future handed out, if any (once: a second call is a no-op)."""
        future = self._future
        if future is None or future._event.is_set():
            return
        exc = self.exception()
        try:
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(self._value())
        except RuntimeError:
            pass  # another thread settled it first


class Work(BaseWork):
    """A collective or point-to-point operation started with ``async_op=True``
    (one MPI request, or a staged chain of them).

    Attributes:
        op: the operation's name, e.g. ``"all_reduce"``.
        seq: its sequence number on the group (None for point-to-point).
    """

    __slots__ = (
        "_requests",
        "_finish",
        "_result",
        "_done",
        "_exc",
        "_lock",
        "_pg",
        "_peer",
        "_nbytes",
        "_t0",
        "_status",
        "_stages",
        "_keep",
        "_entry",
    )

    def __init__(
        self,
        op: str,
        seq: Optional[int],
        requests: List[Any],
        finish: Optional[Callable[[], None]] = None,
        result: Any = None,
        pg: Any = None,
        nbytes: int = 0,
        status: Any = None,
        peer: Optional[int] = None,
        stages: Optional[List[Callable[[], List[Any]]]] = None,
        keep: Any = None,
        entry: Optional[List[Any]] = None,
    ) -> None:
        self.op = op
        self.seq = seq
        self._requests = requests
        self._finish = finish
        self._result = result
        self._done = False
        self._exc: Optional[BaseException] = None
        self._future: Optional[Future] = None
        self._lock = threading.Lock()
        self._pg = pg
        self._peer = peer
        self._nbytes = nbytes
        self._t0 = time.perf_counter() if debug.LEVEL else 0.0
        self._status = status
        self._stages = stages  # each starts the next MPI operations once the last are done
        # The buffers MPI reads until it completes (the send side of a
        # collective), held here: mpi4py's request does not hold them all, and
        # Open MPI was seen to read a freed temporary input of an
        # Ireduce_scatter_block after it returned.
        self._keep = keep
        self._entry = entry  # its flight recorder entry (pycoll.trace.recorder)

    @classmethod
    def done(
        cls,
        op: str,
        seq: Optional[int],
        result: Any,
        pg: Any,
        nbytes: int,
        entry: Optional[List[Any]],
        status: Any = None,
        peer: Optional[int] = None,
    ) -> Work:
        """The Work of an operation found complete as it was issued (a
        collective by the compiled path's tests, pycoll.native; a small send,
        or a receive whose message had arrived, :meth:`peer`), with nothing
        left to do: its flight recorder entry closed, its ``wait()`` returns
        at once.

        It sets every field ``__init__`` does (tests/test_work.py checks that
        none is missed) without ``__init__``'s call and lock or ``_settle``'s
        steps: 1.8 us against 3.0 to make and wait on one on the CI VM, where
        a point-to-point round trip is about 22 us
        (docs/measurements/p2p.py)."""
        work = cls.__new__(cls)
        work.op = op
        work.seq = seq
        work._requests = []
        work._finish = None
        work._result = result
        work._done = True
        work._exc = None
        work._future = None
        work._lock = None  # type: ignore[assignment]  # (a complete Work is never driven)
        work._pg = pg
        work._peer = peer
        work._nbytes = nbytes
        work._t0 = 0.0
        work._status = status
        work._stages = None
        work._keep = None
        work._entry = entry
        recorder.complete(entry)
        return work

    @classmethod
    def peer(
        cls,
        op: str,
        request: Any,
        done: bool,
        tensor: Any,
        pg: Any,
        status: Any,
        peer: Optional[int],
        entry: Optional[List[Any]],
    ) -> Work:
        """The Work of a point-to-point operation (isend, irecv): one request,
        tested once as it was started (``done``, that test's answer). A small
        send, or a receive whose message has arrived, comes back complete
        (:meth:`done`; under ``PYCOLL_DEBUG`` settled as any Work is, so that
        its completion is logged)."""
        if done and not debug.LEVEL:
            return cls.done(op, None, [tensor], pg, tensor.nbytes, entry, status, peer)
        nbytes = tensor.nbytes
        work = cls(op, None, [request], None, [tensor], pg, nbytes, status, peer, None, None, entry)
        if done:
            work._settle()
        return work

    def __repr__(self) -> str:
        state = "completed" if self._done else "pending"
        return f"Work(op={self.op!r}, seq={self.seq}, {state})"

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the operation completes; return True.

        Args:
            timeout: seconds (or a timedelta) to wait at most; None means the
                group's timeout.

        Raises:
            DistTimeoutError: the timeout passed first, with the diagnosis of
                pycoll.watch. The group is unusable afterwards.
            DistBackendError: MPI reported an error.
        """
        if not self._done:
            seconds = None if timeout is None else to_seconds(timeout)
            if self._stages is not None:
                self._finish_earlier(seconds)
            with self._lock:
                if not self._done:
                    self._drive(True, seconds)
        if self._exc is not None:
            raise self._exc
        return True

    def _finish_earlier(self, timeout: Optional[float]) -> None:
        """Drive the group's staged Works issued before this one to completion.

        A staged Work starts its next step only when it is driven, so ranks
        waiting for such Works in different orders would each wait for a step
        the other has not started. Finishing them in issue order first, on
        every rank, makes any order of waits safe."""
        staged = self._pg._staged
        while staged and staged[0] is not self:
            earlier = staged[0]
            try:
                earlier.wait(timeout)
            except Exception:
                return  # its own wait() reports it; this one goes on to its own
            if staged and staged[0] is earlier:
                staged.pop(0)

    def is_completed(self) -> bool:
        """True once the operation has completed (successfully or not). Never blocks."""
        if not self._done and self._lock.acquire(blocking=False):
            try:
                if not self._done:
                    self._drive(block=False)
            finally:
                self._lock.release()
        return self._done

    def exception(self) -> Optional[BaseException]:
        """The error the operation failed with, or None."""
        return self._exc

    def _value(self) -> List[Any]:
        return self._result

    def source_rank(self) -> int:
        """For a completed receive: the global rank the message came from."""
        self.wait()
        if self._status is None:
            if self.op == "irecv":  # from a named peer: the sender is known without a status
                return self._pg._ranks[self._peer]
            raise RuntimeError(f"source_rank() applies to receives, not to {self.op}")
        to_global, statuses = self._status
        return to_global(statuses[0].Get_source())

    def _drive(self, block: bool, timeout: Optional[float] = None) -> None:
        """Wait for (block) or test the requests; finish up once they are done."""
        statuses = None if self._status is None else self._status[1]
        try:
            while True:
                # One test first: a Work waited for late, or a small send, is
                # done already, and then needs no wait set up.
                requests = self._requests
                if not (
                    requests[0].Test()  # watch.tester's MPI_Test, inlined: the common case
                    if statuses is None and len(requests) == 1
                    else watch.tester(requests, statuses)()
                ):
                    if not block:
                        return
                    watch.wait(
                        self._pg, self.op, self.seq, self._requests, timeout, statuses, self._peer
                    )
                if not self._stages:
                    break
                self._requests = self._stages.pop(0)()
        except _mpi.MPI.Exception as exc:
            self._exc = watch.backend_error(self.op, self.seq, exc)
        except DistBackendError as exc:
            self._exc = exc
        self._settle()

    def _settle(self) -> None:
        self._keep = None
        if self._exc is None and self._finish is not None:
            try:
                self._finish()
            except _mpi.MPI.Exception as exc:  # (MPI_Reduce_local refusing a fold)
                self._exc = watch.backend_error(self.op, self.seq, exc)
            except Exception as exc:  # raised by wait(); Ctrl-C still propagates
                self._exc = exc
        self._done = True
        if self._stages is not None:
            try:
                self._pg._staged.remove(self)
            except ValueError:
                pass
        if self.seq is not None:
            watch.end(self._pg, self.seq)
        # (a timeout has marked its flight record entry already: that stands)
        recorder.complete(self._entry, recorder.COMPLETED if self._exc is None else recorder.FAILED)
        if debug.LEVEL:
            debug.log_collective(
                self.op,
                self._pg.group_desc,
                -1 if self.seq is None else self.seq,
                self._nbytes,
                time.perf_counter() - self._t0,
            )
        if self._future is not None:
            self._settle_future()


def to_seconds(timeout: Any) -> float:
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    if seconds < 0:
        raise ValueError(f"timeout must not be negative, got {timeout}")
    return seconds


class AliasWork(BaseWork):
    """The Work of a call pycoll made on stand-ins for the caller's arrays (the
    pinned or aliased host buffers of device arrays, pycoll.gpu.collectives;
    the numpy views of torch tensors, pycoll.torchcompat): the host Work, then
    ``after`` (copying staged results up, an AVG's device division), run once
    by whichever of ``wait()``/``is_completed()`` first sees the host Work
    done, after an error too. ``result()`` and the future give the caller's
    own arrays: ``callers`` maps ``id()`` of each stand-in to its array."""

    __slots__ = ("_work", "_callers", "_after", "_lock", "_done", "_exc")

    def __init__(
        self,
        work: BaseWork,
        callers: Dict[int, Any],
        after: Optional[Callable[[], None]] = None,
    ) -> None:
        self._work = work
        self._callers = callers
        self._after = after
        # Only ``after`` must run once: without it (a torch tensor's view)
        # settling is setting fields, which two threads may both do.
        self._lock = threading.Lock() if after is not None else None
        self._done = False
        self._exc: Optional[BaseException] = None
        self._future = None
        self.op = work.op
        self.seq = work.seq

    def __repr__(self) -> str:
        state = "completed" if self._done else "pending"
        return f"AliasWork(op={self.op!r}, seq={self.seq}, {state})"

    def _settle(self) -> None:
        lock, after = self._lock, self._after
        if lock is None or after is None:
            self._exc = self._work.exception()
            self._done = True
        else:
            with lock:
                if self._done:
                    return
                self._exc = self._work.exception()
                try:
                    after()  # after an error too: it gives back pinned buffers
                except Exception as exc:
                    self._exc = self._exc or exc
                self._done = True
        self._settle_future()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """As :meth:`Work.wait`; the caller's arrays hold the result after it."""
        work = self._work
        try:
            work.wait(timeout)
        finally:
            if not self._done and work.is_completed():
                self._settle()
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        if not self._done and self._work.is_completed():
            self._settle()
        return self._done

    def exception(self) -> Optional[BaseException]:
        return self._exc

    def _value(self) -> List[Any]:
        callers = self._callers
        return [callers.get(id(x), x) for x in self._work.result()]

    def source_rank(self) -> int:
        self.wait()
        return self._work.source_rank()
