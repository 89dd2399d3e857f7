"""The RPC agent: one per worker, over a duplicate of MPI_COMM_WORLD.

Threads:
- the caller's threads pickle and post their requests (mpi4py.util.pkl5,
  which keeps a multi-part message together and needs no size limit);
- one progress thread receives every message (a matched probe, MPI_Improbe,
  so no other receive can take it), routes it, sends the queued DELETEs,
  completes finished sends, fails calls past their deadline, and sends and
  checks heartbeats. It never runs user code: requests go to the worker pool;
  a reply completes its Future where it is taken in, and the Future's
  callbacks (user code) go to the pool;
- a pool of worker threads runs requests. A request that makes its own RPCs
  blocks only its pool thread;
- a caller that waits on a Future takes messages in itself meanwhile (drive).

All messages use one tag, so MPI keeps each pair's messages in order (the
RRef protocol depends on it). Polling: the progress thread spins (yielding
the core) while messages come, then backs off to sleeps of ``idle_pause``.
"""

from __future__ import annotations

import heapq
import itertools
import os
import pickle
import queue
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from .. import _mpi
from ..errors import DistTimeoutError
from ..progress import keep_alive
from ..trace import recorder, timeline
from ..work import Future
from . import current, wire
from .current import NOT_INITIALIZED
from .functions import is_async, when_done
from .rref import Owners, RRef

TAG = 0x7C0
LARGE = 256 << 10  # bytes out of band from which the sender drives its message through
CALL, REMOTE, REPLY, FORK, CONFIRM, DELETE, BEAT, LEAVING, GOODBYE = range(9)


class WorkerInfo:
    """A worker's id (its rank) and name, as torch.distributed.rpc.WorkerInfo."""

    __slots__ = ("id", "name")

    def __init__(self, name: str, id: int) -> None:  # noqa: A002 (torch's name)
        self.name = name
        self.id = id

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, name={self.name})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkerInfo) and (self.id, self.name) == (other.id, other.name)

    def __hash__(self) -> int:
        return hash((self.id, self.name))

    def __reduce__(self) -> Any:
        return WorkerInfo, (self.name, self.id)


class _Call:
    __slots__ = ("future", "dest", "timeout", "what", "began")

    def __init__(self, future: Future, dest: int, timeout: float, what: str) -> None:
        self.future = future
        self.dest = dest
        self.timeout = timeout
        self.what = what
        # when it was made, if it goes on the timeline (pycoll.trace)
        self.began = recorder.clock() if recorder.TRACING else 0.0


class _Pool:
    """The worker threads that run requests and callbacks.

    Daemon threads fed by a queue, rather than concurrent.futures' pool: at
    interpreter exit that pool refuses new work and waits for its threads
    before atexit handlers run, and pycoll.rpc's graceful shutdown at exit
    (an atexit handler) must still serve the other workers' requests, while a
    request stuck in user code must not keep the process from ending.
    """

    def __init__(self, size: int) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.busy = 0  # tasks queued or running
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, name=f"pycoll-rpc-worker-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Any, *args: Any) -> None:
        with self._lock:
            self.busy += 1
        self._queue.put((fn, args))

    def shutdown(self) -> None:
        """Let each thread end once the work queued before is done."""
        for _ in self._threads:
            self._queue.put(None)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException as exc:  # pragma: no cover - the tasks report their own errors
                sys.stderr.write(f"pycoll.rpc: a worker thread failed: {exc!r}\n")
            finally:
                with self._lock:
                    self.busy -= 1
            # while the thread waits for the next task, it must not hold this
            # one's arguments (an RRef kept so would never be freed)
            del item, fn, args


class _Driver:
    """What an RPC Future's wait() and done() call first: the waiting thread
    polls for the reply itself (Agent.drive)."""

    __slots__ = ("agent", "call_id")

    def __init__(self, agent: Agent, call_id: int) -> None:
        self.agent = agent
        self.call_id = call_id

    def wait(self, timeout: Optional[float] = None) -> bool:
        self.agent.drive(self.call_id)
        return True

    def is_completed(self) -> bool:
        self.agent.poll()
        return self.call_id not in self.agent._calls


class Agent:
    """pycoll.rpc's agent (see the module docstring); made by init_rpc."""

    def __init__(self, comm: Any, names: List[str], options: Any) -> None:
        MPI = _mpi.MPI
        from mpi4py.util import pkl5

        self.comm = comm
        self.pcomm = pkl5.Intracomm(comm)
        self.rank = comm.Get_rank()
        self.workers = [WorkerInfo(name, i) for i, name in enumerate(names)]
        self.by_name = {w.name: w for w in self.workers}
        self.me = self.workers[self.rank]
        self.options = options
        self.timeout = float(options.rpc_timeout)
        self.running = True
        self.broken: Optional[str] = None  # why the agent could not finish cleanly
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._calls: Dict[int, _Call] = {}
        self._deadlines: List[Tuple[float, int]] = []
        self._sends: List[Any] = []  # pkl5 requests still in flight
        self._deletes: Deque[Tuple[int, Any, Any]] = deque()
        self._stop = False
        # the shutdown's count: requests sent, served (reply posted), answered (reply taken in)
        self.sent = self.served = self.answered = 0
        # and local work that may make calls: Future callbacks, remote() on itself
        self.begun = self.ended = 0
        self.leaving: Set[int] = set()
        self._goodbyes: Set[int] = set()  # peers whose last message has come (farewell)
        self.owners = Owners()
        self.users: weakref.WeakValueDictionary[Any, Any] = weakref.WeakValueDictionary()
        self._early_confirms: Set[Any] = set()
        now = time.monotonic()
        self._heard = [now] * len(names)
        self._next_beat = now
        self.pool = _Pool(int(options.num_worker_threads))
        self._any_source = MPI.ANY_SOURCE
        self._status = MPI.Status()
        self._pkl5 = pkl5
        # pkl5's header part: how many parts follow it (the layout pkl5.Message.recv
        # reads; pkl5 gives the datatype no public name)
        self._info = pkl5._info_datatype()  # type: ignore[attr-defined]
        self._parts: Dict[int, Tuple[List[Any], int]] = {}  # source -> parts matched, of how many
        self._recv_lock = threading.Lock()
        self._driving = 0  # callers polling for their replies (drive)
        self._idle_pause = float(options.idle_pause)
        self.thread = threading.Thread(
            target=self._progress, name="pycoll-rpc-progress", daemon=True
        )

    def start(self) -> None:
        """Start taking in messages (once the agent is the current one: a
        request may be waiting already, and it may make calls of its own)."""
        self.thread.start()

    # -- ids and names -----------------------------------------------------------------

    def new_id(self) -> Tuple[int, int]:
        return (self.rank, next(self._ids))

    def resolve(self, to: Any, what: str) -> int:
        """The rank of ``to``: a worker name, a WorkerInfo or a rank.

        A destination that is no worker of the job is a RuntimeError, as in
        torch.distributed.rpc (code written for torch catches that type).
        """
        if isinstance(to, WorkerInfo):
            known = self.workers[to.id] if 0 <= to.id < len(self.workers) else None
            if known != to:
                raise RuntimeError(f"{what}: {to} is not a worker of this job ({self._names()})")
            return to.id
        if isinstance(to, str):
            info = self.by_name.get(to)
            if info is None:
                raise RuntimeError(
                    f"{what}: unknown destination worker {to!r}; the workers are {self._names()}"
                )
            return info.id
        if isinstance(to, int) and not isinstance(to, bool):
            if not 0 <= to < len(self.workers):
                raise RuntimeError(
                    f"{what}: unknown destination rank {to}; the workers are ranks "
                    f"0..{len(self.workers) - 1}"
                )
            return to
        raise TypeError(
            f"{what}: `to` must be a worker name, a WorkerInfo or a rank, not {type(to).__name__}"
        )

    def _names(self) -> str:
        return ", ".join(w.name for w in self.workers)

    def seconds(self, timeout: float, what: str) -> float:
        """A call's timeout in seconds (-1: the agent's default; 0: none, returned as inf)."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(
                f"{what}: timeout must be a number of seconds, not {type(timeout).__name__}"
            )
        if timeout < 0:
            timeout = self.timeout
        return float(timeout) if timeout > 0 else float("inf")

    # -- sending -------------------------------------------------------------------------

    def _post(self, dest: int, message: Tuple[Any, ...], nbytes: int = 0) -> None:
        """Send one message. A large one (``nbytes`` from LARGE) is driven to
        completion here, bounded by the agent's timeout: MPI moves it only
        while the sender calls into MPI, and the progress thread's polls are
        far apart; a small one is left to the progress thread if not done."""
        request = self.pcomm.isend(message, dest, TAG)
        parts = list(request)
        testall = _mpi.MPI.Request.Testall
        if testall(parts):
            return
        if nbytes >= LARGE:
            deadline = time.monotonic() + (self.timeout or 60.0)
            spins = 0
            with self._lock:
                self._driving += 1  # the progress thread keeps out of the way
            try:
                while not testall(parts):
                    spins += 1
                    if not spins & 1023 and time.monotonic() > deadline:
                        break  # left to the progress thread, which keeps it alive
                else:
                    return
            finally:
                with self._lock:
                    self._driving -= 1
        with self._lock:
            self._sends.append(request)

    def _send(self, dest: int, head: Tuple[Any, ...], obj: Any) -> None:
        """Pickle ``obj`` for ``dest`` and post ``head + (pins, payload)``; then
        act on the RRefs it carried (pycoll.rpc.rref)."""
        payload, pickler = wire.dumps(obj, dest, self.rank)
        pins = []
        for rref_id, entry in pickler.pins:
            if entry is not None:  # the owner sending to itself pins now
                self.owners.pin(entry)
            pins.append((rref_id, entry is not None))
        for rref, fork in pickler.forks:
            if rref._entry is not None:
                self.owners.add_fork(rref._entry, fork)
        self._post(dest, head + (pins, payload), sum(b.raw().nbytes for b in payload[1]))
        for rref, fork in pickler.forks:
            if rref._entry is None:
                self._post(rref._owner, (FORK, rref._id, fork, dest))

    def call(
        self, dest: int, func: Any, args: Any, kwargs: Any, timeout: float, head: Any = None
    ) -> Future:
        """Send a request to run ``func(*args, **kwargs)`` on ``dest``; a Future of its result."""
        what = getattr(func, "__qualname__", None) or repr(func)
        seconds = self.seconds(timeout, "rpc")
        if current.AUTOGRAD is not None:  # inside a distributed autograd context: carry it
            func, args, kwargs = current.AUTOGRAD(dest, func, args, kwargs, head is not None)
        call_id = next(self._ids)
        future = Future(_Driver(self, call_id), self._run_callback)
        with self._lock:
            if not self.running:
                raise RuntimeError(f"rpc: {NOT_INITIALIZED}")
            self._calls[call_id] = _Call(future, dest, seconds, what)
            if seconds != float("inf"):
                heapq.heappush(self._deadlines, (time.monotonic() + seconds, call_id))
            self.sent += 1
        try:
            self._send(dest, (head or (CALL,)) + (call_id,), (func, args or (), kwargs or {}))
        except BaseException as exc:
            with self._lock:
                self._calls.pop(call_id, None)
                self.sent -= 1
            if isinstance(exc, (pickle.PicklingError, TypeError, AttributeError)):
                raise TypeError(
                    f"rpc to {self.workers[dest].name}: the call to {what} could not be pickled "
                    f"({exc}); functions must be importable by name on the callee and arguments "
                    "picklable"
                ) from exc
            raise
        return future

    def remote(self, dest: int, func: Any, args: Any, kwargs: Any, timeout: float) -> Any:
        if dest == self.rank:
            if current.AUTOGRAD is not None:
                func, args, kwargs = current.AUTOGRAD(dest, func, args, kwargs, True)
            entry = self.owners.create(self.new_id(), None)
            with self._lock:
                self.begun += 1  # ended when it has run: shutdown waits for it
            self.pool.submit(self._run_into, entry, func, args or (), kwargs or {})
            return RRef._of(self, entry)
        rref_id, fork = self.new_id(), self.new_id()
        rref = RRef._user(self, dest, rref_id, fork, False)
        future = self.call(dest, func, args, kwargs, timeout, head=(REMOTE, rref_id, fork))
        future.add_done_callback(rref._created)
        return rref

    def forget(self, owner: int, rref_id: Any, fork: Any) -> None:
        """A user RRef was dropped: its DELETE goes out from the progress thread."""
        if self.running:
            self._deletes.append((owner, rref_id, fork))

    def take_confirmation(self, fork: Any) -> bool:
        with self._lock:
            if fork in self._early_confirms:
                self._early_confirms.discard(fork)
                return True
        return False

    # -- the progress thread -------------------------------------------------------------

    def poll(self) -> bool:
        """Take in and route one message, if one has come and no other thread
        is polling; True if one was taken. Messages are routed in the order
        MPI matched them (the RRef protocol needs a pair's order kept)."""
        if not self._recv_lock.acquire(blocking=False):
            return False
        try:
            taken = self._take()
            if taken is None:
                return False
            if taken[1] is not None:
                self._route(taken[0], taken[1].recv())
            return True
        finally:
            self._recv_lock.release()

    def _take(self) -> Optional[Tuple[int, Any]]:
        """The next message part, matched without waiting: ``(source, message)``
        once all of a message's parts have come (a pkl5.Message), ``(source,
        None)`` for a part of one still coming, None if nothing came.

        pkl5's own improbe matches a message's first part at once but then
        waits (MPI_Mprobe) for the parts after it: a message a partition cut in
        two (its header here, the rest lost with the link) stalled every
        receive of this rank for good, and its callers were told that peers
        that had answered did not. Here the parts matched so far wait, per
        source, for the rest: a source's next message is its next part (MPI
        keeps a pair's messages in order), and the other sources' messages
        go on being taken meanwhile."""
        MPI, status = _mpi.MPI, self._status
        part = MPI.Comm.Improbe(self.comm, self._any_source, TAG, status)
        if part is None:
            return None
        source = status.Get_source()
        held = self._parts.pop(source, None)
        if held is None:
            held = ([part], 1 + status.Get_elements(self._info))
        else:
            held[0].append(part)
        parts, total = held
        while len(parts) < total:
            part = MPI.Comm.Improbe(self.comm, source, TAG, status)
            if part is None:
                self._parts[source] = held
                return source, None
            parts.append(part)
        return source, self._pkl5.Message(parts)

    def drive(self, call_id: int) -> None:
        """Wait for call ``call_id``'s reply, taking messages in meanwhile.

        A caller that waits polls for itself (the progress thread steps back
        meanwhile): its reply then wakes no other thread, and no two threads
        of the process contend for the GIL on every poll.
        """
        with self._lock:
            self._driving += 1
        try:
            idle = 0
            spin = int(self.options.spin)
            while call_id in self._calls and not self._stop:
                if self.poll():
                    idle = 0
                    continue
                idle += 1
                if self.pool.busy > 0:
                    time.sleep(5e-5)  # worker threads need the GIL more than this poll
                elif idle < spin:
                    os.sched_yield()
                else:
                    time.sleep(min(self._idle_pause, 1e-5 * (idle - spin + 1)))
        finally:
            with self._lock:
                self._driving -= 1

    def _progress(self) -> None:
        idle = 0
        spin = int(self.options.spin)
        busy_pause = float(self.options.busy_pause)
        _precise_sleeps()
        try:
            while not self._stop:
                if self.poll():
                    idle = 0
                    continue
                if self._housekeeping():
                    idle = 0
                    continue
                idle += 1
                if self._driving:  # a waiting caller polls; keep out of its way
                    time.sleep(self._idle_pause)
                elif idle < spin:
                    if busy_pause > 0:
                        time.sleep(busy_pause)
                    else:
                        os.sched_yield()
                else:
                    time.sleep(min(self._idle_pause, 1e-5 * (idle - spin + 1)))
        except BaseException as exc:  # pragma: no cover - a bug or MPI failure: say so loudly
            self.broken = f"pycoll.rpc's progress thread on {self.me} failed: {exc!r}"
            sys.stderr.write(self.broken + "\n")
            self._fail_all(RuntimeError(self.broken))

    def _route(self, source: int, message: Tuple[Any, ...]) -> None:
        self._heard[source] = time.monotonic()
        kind = message[0]
        if kind == REPLY:
            with self._lock:
                call = self._calls.pop(message[1], None)
            self._pin(message[3])
            if call is not None:  # else: it timed out already
                self._complete(call, source, message[2], message[3], message[4])
            else:
                self._unpin(message[3])
        elif kind == CALL:
            self._pin(message[2])
            self.pool.submit(self._serve, source, message[1], message[2], message[3])
        elif kind == REMOTE:
            _, rref_id, fork, call_id, pins, payload = message
            entry = self.owners.create(rref_id, fork)
            self._pin(pins)
            self.pool.submit(self._serve, source, call_id, pins, payload, entry)
        elif kind == FORK:
            _, rref_id, fork, holder = message
            held = self.owners.get(rref_id)
            if held is not None:
                self.owners.add_fork(held, fork)
            self._post(holder, (CONFIRM, fork))
        elif kind == CONFIRM:
            rref = self.users.pop(message[1], None)
            if rref is not None:
                rref._confirmed = True
            else:
                with self._lock:
                    self._early_confirms.add(message[1])
        elif kind == DELETE:
            self.owners.delete(message[1], message[2])
        elif kind == LEAVING:
            self.leaving.add(source)
        elif kind == GOODBYE:
            self._goodbyes.add(source)
        # BEAT: hearing from the peer was the point

    def _pin(self, pins: List[Any]) -> None:
        for rref_id, pinned in pins:
            if not pinned:
                self.owners.pin_id(rref_id)

    def _unpin(self, pins: List[Any]) -> None:
        for rref_id, _ in pins:
            self.owners.unpin(rref_id)

    def _housekeeping(self) -> bool:
        """Work other than receiving; True if there was some."""
        did = False
        while self._deletes:
            owner, rref_id, fork = self._deletes.popleft()
            self._post(owner, (DELETE, rref_id, fork))
            did = True
        if self._sends:
            self._test_sends()
        now = time.monotonic()
        if self._deadlines and self._deadlines[0][0] <= now:
            self._expire(now)
            did = True
        if self.options.heartbeat > 0 and now >= self._next_beat:
            self._beat(now)
        return did

    def _expire(self, now: float) -> None:
        expired = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                _, call_id = heapq.heappop(self._deadlines)
                call = self._calls.pop(call_id, None)
                if call is not None:
                    expired.append(call)
        for call in expired:
            worker = self.workers[call.dest]
            error = DistTimeoutError(
                f"RPC ran for more than the set timeout ({call.timeout:g} s) and was marked "
                f"with an error: the call to {call.what} on {worker} got no reply in time",
                op="rpc",
                elapsed=call.timeout,
                ranks=[call.dest],
            )
            call.future.set_exception(error)
        with self._lock:  # after set_exception, which counted its callbacks
            self.answered += len(expired)

    def _beat(self, now: float) -> None:
        every = float(self.options.heartbeat)
        self._next_beat = now + every
        for rank in range(len(self.workers)):
            if rank != self.rank:
                self._post(rank, (BEAT,))
        limit = every * float(self.options.heartbeat_misses)
        silent = {
            call.dest
            for call in list(self._calls.values())
            if call.dest != self.rank and now - self._heard[call.dest] > limit
        }
        for rank in silent:
            worker = self.workers[rank]
            quiet = now - self._heard[rank]
            self._fail_peer(
                rank,
                DistTimeoutError(
                    f"pycoll.rpc: {worker} has stopped answering: nothing heard from it for "
                    f"{quiet:.1f} s (heartbeat every {every:g} s, {self.options.heartbeat_misses} "
                    "missed); its pending calls fail",
                    op="rpc",
                    ranks=[rank],
                ),
            )

    def _fail_peer(self, rank: int, error: BaseException) -> None:
        with self._lock:
            failed = [cid for cid, call in self._calls.items() if call.dest == rank]
            calls = [self._calls.pop(cid) for cid in failed]
        for call in calls:
            call.future.set_exception(error)
        with self._lock:
            self.answered += len(calls)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            calls, self._calls = list(self._calls.values()), {}
        for call in calls:  # a call leaves _calls before it completes: none is complete
            call.future.set_exception(error)
        with self._lock:
            self.answered += len(calls)

    # -- the worker pool -----------------------------------------------------------------

    def _serve(
        self, source: int, call_id: int, pins: List[Any], payload: Any, entry: Any = None
    ) -> None:
        """Run one request and reply (for REMOTE, store the value in ``entry``)."""

        def done(value: Any, error: Any) -> None:
            self._finish(source, call_id, value, error, entry)

        try:
            try:
                func, args, kwargs = wire.loads(payload)
            finally:
                self._unpin(pins)
        except BaseException as exc:
            done(None, exc)
        else:
            _run(func, args, kwargs, done)

    def _finish(self, source: int, call_id: int, value: Any, error: Any, entry: Any) -> None:
        if entry is not None:  # remote(): the owner keeps the value; the reply confirms
            _settle(entry, value, error, self.me)
            value, error = None, None
        try:
            self._reply(source, call_id, value, error)
        finally:
            with self._lock:
                self.served += 1

    def _reply(self, source: int, call_id: int, value: Any, error: Any) -> None:
        if error is None:
            try:
                self._send(source, (REPLY, call_id, True), value)
                return
            except Exception as exc:
                error = TypeError(f"the result could not be pickled: {exc}")
        report = wire.remote_error(error, repr(self.me))
        try:
            self._send(source, (REPLY, call_id, False), report)
        except Exception:  # the exception type does not pickle: send its text
            self._send(source, (REPLY, call_id, False), (None, report[1]))

    def _run_callback(self, callback: Any, future: Future) -> None:
        """A Future's callback (user code) goes to the pool; the shutdown counts
        it as a call in flight until it has run."""
        with self._lock:
            self.begun += 1
        self.pool.submit(self._callback, callback, future)

    def _callback(self, callback: Any, future: Future) -> None:
        try:
            callback(future)
        finally:
            with self._lock:
                self.ended += 1

    def _complete(self, call: _Call, source: int, ok: bool, pins: List[Any], payload: Any) -> None:
        """A reply, taken in by the progress thread or a waiting caller: the
        value is unpickled and the Future completed there (its callbacks go to
        the pool)."""
        if call.began:
            name = self.workers[source].name
            timeline.add(f"rpc {call.what}", "rpc", call.began, recorder.clock(), peer=name)
        try:
            try:
                value = wire.loads(payload)
            finally:
                self._unpin(pins)
        except BaseException as exc:
            ok, value = (
                False,
                (None, f"the reply from {self.workers[source]} could not be unpickled: {exc!r}"),
            )
        if ok:
            call.future.set_result(value)
        else:
            call.future.set_exception(wire.rebuild_error(*value))
        with self._lock:  # after set_*, which counted its callbacks in `begun`
            self.answered += 1

    def _run_into(self, entry: Any, func: Any, args: Any, kwargs: Any) -> None:
        """remote() on this worker itself."""
        try:
            _run(func, args, kwargs, lambda v, e: _settle(entry, v, e, self.me))
        finally:
            with self._lock:
                self.ended += 1

    # -- shutdown ------------------------------------------------------------------------

    def pending(self) -> int:
        with self._lock:
            return len(self._calls)

    def stop(self, deadline: float) -> bool:
        """Stop the progress thread and the pool; False if they did not stop by ``deadline``."""
        with self._lock:
            self.running = False
        self._stop = True
        self.thread.join(max(0.0, deadline - time.monotonic()))
        self.pool.shutdown()
        return not self.thread.is_alive()

    def _test_sends(self) -> bool:
        """Drop the sends that have completed; True if none is left."""
        testall = _mpi.MPI.Request.Testall
        with self._lock:
            sends, self._sends = self._sends, []
        pending = [s for s in sends if not testall(list(s))]  # MPI outside the lock
        with self._lock:
            self._sends.extend(pending)
            return not self._sends

    def farewell(self, deadline: float) -> bool:
        """After :meth:`stop`: whether no message of a peer's can still come,
        so that the communicator may be freed.

        The shutdown's count covers calls, not every message: a heartbeat, a
        DELETE of a reference dropped while the workers stopped, a fork's
        CONFIRM may still be on its way. A message that arrives after its
        communicator was freed is kept for the next communicator given the
        same context id (Open MPI then aborts if that one is too small for
        its source, or matches it there). So each worker sends every peer a
        GOODBYE, its last message here, and takes in messages until every
        peer's GOODBYE has come, dropping what came before it (the agent has
        stopped); MPI keeps each pair's messages in order. False if one did
        not come by ``deadline`` (the communicator must then be left alone).
        """
        others = [w.id for w in self.workers if w.id != self.rank]
        for peer in others:
            self._post(peer, (GOODBYE,))
        waiting = set(others) - self._goodbyes
        while waiting:
            taken = self._take()
            if taken is None or taken[1] is None:
                if time.monotonic() > deadline:
                    keep_alive(list(self._sends))  # (MPI may still read their buffers)
                    return False
                if taken is None:
                    time.sleep(1e-4)
                continue
            source, message = taken
            if message.recv()[0] == GOODBYE:
                waiting.discard(source)
        return self.drain_sends(deadline)

    def drain_sends(self, deadline: float) -> bool:
        """Wait for the sends in flight, at most until ``deadline``."""
        while not self._test_sends():
            if time.monotonic() > deadline:
                keep_alive(list(self._sends))
                return False
            time.sleep(1e-4)
        return True


def _precise_sleeps() -> None:
    """Make this thread's short sleeps last what they ask (Linux rounds a
    sleep up by the thread's timer slack, 50 us by default, more than the
    pause between polls while messages come)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK: 1 us
    except (OSError, AttributeError):
        pass


def _run(func: Any, args: Any, kwargs: Any, done: Any) -> None:
    """``done(value, error)`` with the outcome of ``func(*args, **kwargs)``: at
    once, or for an async_execution function when its Future completes."""
    try:
        result = func(*args, **kwargs)
        if is_async(func):
            when_done(result, done)
            return
    except BaseException as exc:
        done(None, exc)
    else:
        done(result, None)


def _as_remote(error: BaseException, me: WorkerInfo) -> BaseException:
    return wire.rebuild_error(*wire.remote_error(error, repr(me)))


def _settle(entry: Any, value: Any, error: Any, me: WorkerInfo) -> None:
    if error is None:
        entry.future.set_result(value)
    else:
        entry.future.set_exception(_as_remote(error, me))
