"""The torch Work of the pycoll backend, and the completer that fulfils its futures.

A collective issued through torch returns a :class:`TorchWork`: a
``torch.distributed._Work`` over one or more of pycoll's Works (pycoll.work).
``wait()`` waits on them within the group's timeout, with pycoll's
diagnosis raised as torch's DistBackendError family (pycoll.torch.errors).

``get_future()`` gives a real ``torch.futures.Future`` holding the outputs
(``[tensor]`` for an all_reduce, as DDP's hooks read it). MPI has no
completion callback, so one thread per process, the :class:`Completer`,
tests the pending operations (which also gives MPI the progress an overlapped
DDP bucket needs) and sets each future once its operation is done, backing
off from a yield to half a millisecond while nothing completes. It runs only
while some future is pending; a Work whose future nobody asks for costs
nothing here.

Order: a future's callbacks run in the completer's thread, and a comm hook's
callback may issue collectives (PowerSGD does). So that every rank issues
those in the same order, the completer completes a group's collective
futures in the order they were asked for, and the backend sends collectives
issued from its thread over a second communicator of the group (see
pycoll.torch.backend): each of the two streams of collectives is then in one
order on every rank.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Sequence

import torch.distributed as dist
from torch.futures import Future

from ..work import BaseWork, to_seconds
from .errors import as_torch

__all__ = ["TorchWork", "COMPLETER"]

SPINS = 32  # polls that only yield the GIL before the completer starts to sleep
MAX_NAP = 5e-4  # seconds: the longest the completer sleeps between polls


class TorchFuture(Future):
    """A torch Future whose callbacks always run on the completer's thread.

    torch runs a callback added to a future that is already complete at once,
    in the thread that adds it. Whether a future is complete when DDP's comm
    hook chains onto it depends on timing, so a callback that issues a
    collective (PowerSGD's do) would issue it from the main thread on one rank
    and from the completer's on another, and the ranks' orders would differ.
    Here every callback (of ``then`` and ``add_done_callback``, on this future
    and on the futures ``then`` makes) runs on the completer's thread, in the
    order the futures complete and the callbacks are added, which is the same
    on every rank."""

    def then(self, callback: Callable[[Future], Any]) -> Future:
        child = TorchFuture()

        def run() -> None:
            try:
                child.set_result(callback(self))
            except Exception as exc:  # the child's to raise
                child.set_exception(exc)

        self._when_done(run)
        return child

    def add_done_callback(self, callback: Callable[[Future], None]) -> None:
        self._when_done(lambda: callback(self))

    def _when_done(self, task: Callable[[], None]) -> None:
        def hop(_: Any) -> None:
            if COMPLETER.is_own_thread():
                task()
            else:  # complete already, and added from another thread
                COMPLETER.call_soon(task)

        super().add_done_callback(hop)


def _torch_error(exc: BaseException) -> BaseException:
    return as_torch(exc) or exc


class TorchWork(dist._Work):
    """An operation of the pycoll backend, as torch's Work.

    Args:
        works: pycoll's Works the operation is made of (none when it already
            completed, as a synchronous call does).
        value: what ``result()`` and the future hold (the output tensors).
        key: the pycoll group the operation is a collective of (it orders
            the futures, see the module's docstring); None for
            point-to-point.
        timeout: seconds ``wait()`` waits by default; None: the group's
            (``key``'s; pycoll's Works wait that long when given no
            timeout, and the completer reads it only for a future asked
            for, so a call does not pay for reading it).
        source: for a receive from any rank, maps pycoll's global source rank
            to the group rank torch expects from ``_source_rank()``.
    """

    # Set later, if ever (as class defaults, so that making a Work, which
    # every call through torch does, sets only what it was given): the
    # future asked for, the error seen, and when the completer gives up
    # waiting for the operation (the group's timeout, or the call's; set by
    # Completer.add).
    _future: Optional[Future] = None
    _exc: Optional[BaseException] = None
    _deadline: Optional[float] = None

    def __init__(
        self,
        works: Sequence[BaseWork],
        value: List[Any],
        key: Any = None,
        timeout: Optional[float] = None,
        source: Any = None,
    ) -> None:
        super().__init__()
        self._works = works
        self._value = value
        self._key = key
        self._timeout = timeout
        self._source = source

    def __repr__(self) -> str:
        ops = ",".join(getattr(w, "op", "?") for w in self._works) or "done"
        return f"TorchWork({ops}, {'completed' if self.is_completed() else 'pending'})"

    def wait(self, timeout: Any = None) -> bool:
        """Wait for the operation (within ``timeout``, a timedelta or seconds;
        None or zero: the call's or the group's timeout); True once complete.

        Raises:
            DistTimeoutError: it did not complete in time (pycoll.torch.errors,
                a torch DistBackendError), with pycoll's diagnosis.
        """
        seconds = to_seconds(timeout) if timeout is not None else 0.0
        limit = seconds if seconds > 0 else self._timeout
        for work in self._works:
            try:
                work.wait(limit)
            except Exception as exc:
                self._exc = self._exc or _torch_error(exc)
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        """True once every part has completed (successfully or not). Never blocks."""
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        """True once completed without an error."""
        return self.is_completed() and self.exception() is None

    def exception(self) -> Optional[BaseException]:
        """The error the operation failed with (torch's family), or None."""
        if self._exc is None:
            for work in self._works:
                exc = work.exception()
                if exc is not None:
                    self._exc = _torch_error(exc)
                    break
        return self._exc

    def result(self) -> List[Any]:
        """The output tensors, once complete."""
        self.wait()
        return self._value

    def _source_rank(self) -> int:
        """For a receive from any rank: the group rank of the sender."""
        self.wait()
        if self._source is None:
            raise RuntimeError("_source_rank() applies to a receive from any rank")
        return int(self._source(self._works[0].source_rank()))

    source_rank = _source_rank

    def get_future(self) -> Future:
        """A torch Future holding the outputs, completed when MPI completes.

        Asked for on the completer's own thread (a comm hook's callback that
        issues a collective), the operation is finished first: that thread
        is the one that completes futures, so it must not wait on one.
        """
        if self._future is None:
            self._future = TorchFuture()
            if not self._works or COMPLETER.is_own_thread():
                self._complete_now()
            else:
                COMPLETER.add(self)
        return self._future

    def _complete_now(self) -> None:
        try:
            self.wait()
        except Exception:
            pass  # it is the future's exception
        self._settle()

    def _settle(self) -> None:
        """Set the future from the completed operation (runs its callbacks)."""
        future = self._future
        assert future is not None
        exc = self.exception()
        if exc is None:
            future.set_result(self._value)
        else:
            future.set_exception(exc)


class Completer:
    """The thread that completes the futures of pending TorchWorks (see the
    module's docstring), started on the first future asked for."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: Deque[TorchWork] = deque()
        self._tasks: Deque[Callable[[], None]] = deque()
        self._thread: Optional[threading.Thread] = None
        self._ident: Optional[int] = None

    def is_own_thread(self) -> bool:
        return threading.get_ident() == self._ident

    def add(self, work: TorchWork) -> None:
        """Complete ``work``'s future once its operation completes, or with
        pycoll's timeout error once it has waited the operation's timeout."""
        limit = work._timeout
        if limit is None and work._key is not None:
            limit = work._key.timeout.total_seconds()
        if limit is not None:
            work._deadline = time.monotonic() + limit
        with self._cond:
            self._pending.append(work)
            self._wake()

    def call_soon(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the completer's thread (a future's callback)."""
        with self._cond:
            self._tasks.append(task)
            self._wake()

    def _wake(self) -> None:  # under self._cond
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name="pycoll-torch-completer", daemon=True
            )
            self._thread.start()
        self._cond.notify()

    def _run(self) -> None:
        self._ident = threading.get_ident()
        idle = 0
        while True:
            with self._cond:
                while not self._pending and not self._tasks:
                    idle = 0
                    self._cond.wait()
                tasks, self._tasks = self._tasks, deque()
                pending = list(self._pending)
            for task in tasks:
                try:
                    task()
                except Exception:  # a callback's error belongs to its own future
                    pass
            ready = self._ready(pending) if pending else []
            if ready:
                with self._cond:
                    for work in ready:
                        self._pending.remove(work)
                for work in ready:  # callbacks run here, outside the lock
                    try:
                        work._settle()
                    except Exception:  # a callback's error belongs to its own future
                        pass
            if ready or tasks:
                idle = 0
                continue
            idle += 1
            time.sleep(0 if idle < SPINS else min(MAX_NAP, 1e-6 * (idle - SPINS + 1) ** 2))

    @staticmethod
    def _ready(pending: List[TorchWork]) -> List[TorchWork]:
        """The pending Works to complete now: every completed one, except a
        collective whose group has an earlier collective still pending."""
        ready = []
        blocked = set()
        for work in pending:
            key = work._key
            if key is not None and key in blocked:
                continue
            if work.is_completed():
                ready.append(work)
            elif work._deadline is not None and time.monotonic() > work._deadline:
                try:  # overdue: pycoll's timeout error, with its diagnosis
                    work.wait(1e-3)
                except Exception:
                    pass  # the future's exception
                ready.append(work)
            elif key is not None:
                blocked.add(key)
        return ready


COMPLETER = Completer()


def done(value: List[Any]) -> TorchWork:
    """The Work of an operation that already completed."""
    return TorchWork((), value)
