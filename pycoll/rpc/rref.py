"""RRef: a reference to a value held by one worker (its owner), and the
bookkeeping that frees the value once no reference to it is left.

The protocol follows torch's RRef design (the owner counts the user
references, "forks", that exist anywhere; a fork made by a user is reported
to the owner, which confirms it), over one fact MPI gives: messages from one
worker to another on the agent's communicator and tag arrive in the order
they were sent. Hence:

- ``remote(to, f)``: the creator sends REMOTE with the new id and its own
  fork; the owner's progress thread registers that fork before running ``f``,
  and the reply confirms it.
- Pickling an RRef for a message to a third worker makes a new fork there.
  The owner registers its own forks before the message goes; a user sends
  FORK to the owner after the message, before its own reference can be
  dropped (the call still holds it), so the owner hears of the child before
  the parent's DELETE. The owner answers FORK with CONFIRM to the new holder.
  A DELETE that overtakes its FORK (they come from different workers) is
  remembered and cancels the FORK when it arrives.
- Pickling an RRef for its owner sends only the id; the owner pins the entry
  when the message arrives (the sender's fork still holds it, its DELETE
  comes later) until the arguments are rebuilt.
- A user RRef that is garbage-collected queues DELETE; the progress thread
  sends it. The owner drops the entry when no fork and no pin is left; the
  value lives on while the owner's own RRef objects hold it.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Set, Tuple

from ..work import Future
from .current import current
from .functions import async_execution

RRefId = Tuple[int, int]  # (creating rank, number)
ForkId = Tuple[int, int]


class Owned:
    """The owner's record of one RRef: the value (a Future, since remote()
    computes it later), the user forks alive elsewhere, and pins (messages on
    their way in that name it)."""

    __slots__ = ("id", "future", "forks", "pins", "__weakref__")

    def __init__(self, rref_id: RRefId) -> None:
        self.id = rref_id
        self.future = Future()
        self.forks: Set[ForkId] = set()
        self.pins = 0


class Owners:
    """The entries an owner keeps for its users (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Dict[RRefId, Owned] = {}
        self._early: Dict[RRefId, Set[ForkId]] = {}  # DELETEs that overtook their FORK

    def __len__(self) -> int:
        return len(self._held)

    def create(self, rref_id: RRefId, fork: Optional[ForkId]) -> Owned:
        entry = Owned(rref_id)
        if fork is not None:
            with self._lock:
                entry.forks.add(fork)
                self._held[rref_id] = entry
        return entry

    def get(self, rref_id: RRefId) -> Optional[Owned]:
        return self._held.get(rref_id)

    def add_fork(self, entry: Owned, fork: ForkId) -> None:
        with self._lock:
            early = self._early.get(entry.id)
            if early is not None and fork in early:
                early.discard(fork)  # its holder dropped it already
                return
            entry.forks.add(fork)
            self._held[entry.id] = entry

    def delete(self, rref_id: RRefId, fork: ForkId) -> None:
        with self._lock:
            entry = self._held.get(rref_id)
            if entry is None:
                return
            if fork in entry.forks:
                entry.forks.discard(fork)
                self._release(entry)
            else:
                self._early.setdefault(rref_id, set()).add(fork)

    def pin(self, entry: Owned) -> None:
        with self._lock:
            entry.pins += 1
            self._held[entry.id] = entry

    def pin_id(self, rref_id: RRefId) -> None:
        with self._lock:
            entry = self._held.get(rref_id)
            if entry is not None:
                entry.pins += 1

    def unpin(self, rref_id: RRefId) -> None:
        with self._lock:
            entry = self._held.get(rref_id)
            if entry is not None:
                entry.pins -= 1
                self._release(entry)

    def _release(self, entry: Owned) -> None:
        if not entry.forks and entry.pins <= 0:
            del self._held[entry.id]
            # no FORK can still be on its way: its parent would still be a fork
            self._early.pop(entry.id, None)


class RRef:
    """A reference to a value owned by one worker, as torch.distributed.rpc.RRef.

    ``RRef(value)`` makes a reference owned by this worker; ``remote()``
    makes one owned by another. RRefs may be passed to any worker as (part
    of) the arguments or the result of an RPC, and back to the owner, where
    they become the owner's reference again.
    """

    __slots__ = (
        "_agent",
        "_owner",
        "_id",
        "_fork",
        "_entry",
        "_confirmed",
        "_error",
        "__weakref__",
    )

    def __init__(self, value: Any, type_hint: Any = None) -> None:  # noqa: ARG002 (torch's)
        agent = current("RRef")
        entry = Owned(agent.new_id())
        entry.future.set_result(value)
        self._init(agent, agent.rank, entry.id, None, entry)

    def _init(
        self,
        agent: Any,
        owner: int,
        rref_id: RRefId,
        fork: Optional[ForkId],
        entry: Optional[Owned],
    ) -> None:
        self._agent = agent
        self._owner = owner
        self._id = rref_id
        self._fork = fork
        self._entry = entry
        self._confirmed = entry is not None
        self._error: Optional[BaseException] = None

    @classmethod
    def _of(cls, agent: Any, entry: Owned) -> RRef:
        """The owner's reference to one of its entries."""
        rref = cls.__new__(cls)
        rref._init(agent, agent.rank, entry.id, None, entry)
        return rref

    @classmethod
    def _user(cls, agent: Any, owner: int, rref_id: RRefId, fork: ForkId, confirmed: bool) -> RRef:
        rref = cls.__new__(cls)
        rref._init(agent, owner, rref_id, fork, None)
        rref._confirmed = confirmed or agent.take_confirmation(fork)
        if not rref._confirmed:
            agent.users[fork] = rref
        return rref

    # -- torch's methods -------------------------------------------------------------

    def is_owner(self) -> bool:
        """True on the worker that holds the value."""
        return self._entry is not None

    def owner(self) -> Any:
        """The owner's WorkerInfo."""
        return self._agent.workers[self._owner]

    def owner_name(self) -> str:
        return self._agent.workers[self._owner].name

    def confirmed_by_owner(self) -> bool:
        """True once the owner knows of this reference (always on the owner)."""
        return self._confirmed

    def local_value(self) -> Any:
        """The value itself, on the owner (waiting for remote() to compute it).

        Raises:
            RuntimeError: on a worker that is not the owner.
        """
        if self._entry is None:
            me = self._agent.workers[self._agent.rank]
            raise RuntimeError(
                f"RRef.local_value() called on {me}, which does not own this RRef (its "
                f"owner is {self.owner()}): call to_here() to fetch a copy of the value"
            )
        return self._entry.future.wait()

    def to_here(self, timeout: float = -1) -> Any:
        """The value: itself on the owner, a copy fetched from the owner elsewhere.

        An error raised by the function that remote() ran is raised here.
        """
        if self._entry is not None:
            return self.local_value()
        if self._error is not None:
            raise self._error
        return self._agent.call(self._owner, _fetch, (self,), None, timeout).wait()

    def rpc_sync(self, timeout: float = -1) -> _Proxy:
        """``rref.rpc_sync().method(*args)`` runs ``method`` on the owner's
        value and returns its result."""
        return _Proxy(self, "sync", timeout)

    def rpc_async(self, timeout: float = -1) -> _Proxy:
        """As rpc_sync(), returning a Future."""
        return _Proxy(self, "async", timeout)

    def remote(self, timeout: float = -1) -> _Proxy:
        """As rpc_sync(), returning an RRef to the result, held by the owner."""
        return _Proxy(self, "remote", timeout)

    def __repr__(self) -> str:
        kind = "OwnerRRef" if self._entry is not None else "UserRRef"
        return f"{kind}(owner={self.owner_name()}, id={self._id})"

    # -- pickling and lifetime -------------------------------------------------------

    def _reduce_for(self, pickler: Any) -> Any:
        if pickler.dest == self._owner:  # going home: the owner's entry, by id
            pickler.pins.append((self._id, self._entry))
            return _at_owner, (self._id,)
        fork = self._agent.new_id()
        pickler.forks.append((self, fork))
        return _as_user, (self._owner, self._id, fork, self._entry is not None)

    def __reduce__(self) -> Any:
        raise RuntimeError(
            "an RRef can only be sent as (part of) the arguments or result of a pycoll.rpc call"
        )

    def _created(self, future: Future) -> None:
        """remote()'s reply: the owner has registered this reference."""
        try:
            future.value()
            self._confirmed = True
        except BaseException as exc:
            self._error = exc

    def __del__(self) -> None:
        fork = getattr(self, "_fork", None)
        if fork is not None:
            self._agent.forget(self._owner, self._id, fork)


class _Proxy:
    """``rref.rpc_sync()`` and its kin: attribute calls go to the owner's value."""

    def __init__(self, rref: RRef, how: str, timeout: float) -> None:
        self._rref = rref
        self._how = how
        self._timeout = timeout

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            rref, agent = self._rref, self._rref._agent
            params = (rref, name, args, kwargs)
            if self._how == "remote":
                return agent.remote(rref._owner, _invoke, params, None, self._timeout)
            future = agent.call(rref._owner, _invoke, params, None, self._timeout)
            return future.wait() if self._how == "sync" else future

        return call


# -- run on the owner -------------------------------------------------------------------


@async_execution
def _fetch(rref: RRef) -> Future:
    """The value of one of this worker's RRefs, once computed."""
    entry = rref._entry
    assert entry is not None
    return entry.future


def _invoke(rref: RRef, name: str, args: Any, kwargs: Any) -> Any:
    return getattr(rref.local_value(), name)(*args, **kwargs)


# -- rebuilt on arrival -----------------------------------------------------------------


def _at_owner(rref_id: RRefId) -> RRef:
    agent = current("RRef")
    entry = agent.owners.get(rref_id)
    if entry is None:
        raise RuntimeError(f"RRef {rref_id} reached its owner after the owner released it")
    return RRef._of(agent, entry)


def _as_user(owner: int, rref_id: RRefId, fork: ForkId, confirmed: bool) -> RRef:
    return RRef._user(current("RRef"), owner, rref_id, fork, confirmed)


__all__ = ["RRef"]
