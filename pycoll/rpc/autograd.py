"""pycoll.rpc.autograd: distributed autograd over pycoll.rpc, as torch.distributed.autograd.

    import pycoll.rpc.autograd as dist_autograd
    with dist_autograd.context() as context_id:
        hidden = rpc.rpc_sync("worker1", stage1, args=(x,))   # runs on worker1
        loss = stage2(hidden).sum()
        dist_autograd.backward(context_id, [loss])             # through worker1 too
        grads = dist_autograd.get_gradients(context_id)        # this worker's leaves

How it works (docs/design.md, "Distributed autograd"):

- A context has an id unique in the job (the rank in the top 16 bits). The
  thread that opens it carries it; every RPC that thread makes (rpc_sync,
  rpc_async, remote, RRef.to_here and the RRef proxies) carries it too, and
  the callee runs the function in the same context, so nested calls
  (A -> B -> C, and calls to itself) carry it on.
- A tensor that requires grad and leaves in such a message is recorded in the
  sender's context (a "send"); the receiver rebuilds it as the output of a
  ``_Recv`` node. Results come back the same way.
- ``backward`` runs torch's own engine (``torch.autograd.grad``) on this
  worker's part of the graph, from the roots to its leaves. When it reaches a
  ``_Recv`` node, the gradient goes back to the sender (an RPC); there the
  engine runs again from the recorded send, and so on. Each worker adds the
  gradients of its own leaves into the context, never into ``.grad``.
  ``backward`` returns when every worker it reached is done, or raises the
  first error, naming the worker ("Error on Node 2: ...").
- Leaving the context releases it here and, by messages, on every worker it
  reached (each passes the release on).

torch (CPU tensors) is required; nothing of it is imported by ``import
pycoll`` or ``import pycoll.rpc``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import traceback
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

try:
    import torch
except ImportError as exc:  # pragma: no cover - the torch venvs have it; tested without
    raise ImportError(
        "pycoll.rpc.autograd needs torch: install it with pip install 'pycoll-mpi[torch]' "
        "(or install torch itself)"
    ) from exc

from ..work import Future
from . import current as _current
from . import wire
from .functions import async_execution, is_async, when_done

__all__ = [
    "Context",
    "backward",
    "context",
    "current_context",
    "get_gradients",
    "retrieve_context",
]

_SHIFT = 48  # a context id is (rank << 48) + a counter, as torch's
_lock = threading.Lock()
_contexts: Dict[int, Context] = {}
_counter = itertools.count()
_local = threading.local()  # .context: the thread's context id; .running: its backward pass
# The one input of every _Recv node: a leaf that requires grad, so that the
# received tensor gets a grad_fn; it never receives a gradient itself.
_ANCHOR = torch.empty(0, requires_grad=True)


def _inner(budget: float) -> float:
    """The time budget of the calls one worker further down a backward chain:
    a little less than this worker's (5%, at most 0.25 s less), so that the
    call to a worker that stops answering times out before the calls above
    it, and that worker is the one named. A chain of a hundred hops keeps
    most of a 60 s budget."""
    return budget - min(0.05 * budget, 0.25)


class Context:
    """One distributed autograd context on this worker.

    Holds what the backward pass needs: the tensors sent from here in the
    context's messages (the "send functions"), the ``_Recv`` nodes of the
    tensors received, the workers the context reached, and the gradients
    accumulated for this worker's leaves.
    """

    def __init__(self, context_id: int) -> None:
        self.id = context_id
        self.lock = threading.Lock()
        self.sends: Dict[int, List[Any]] = {}  # message id -> the tensors it carried
        self.recvs: Dict[Tuple[int, int, int], Any] = {}  # (sender, message, slot) -> node
        self.workers: Set[int] = set()  # ranks this context sent to or heard from
        self.grads: Dict[Any, Any] = {}  # leaf tensor -> its accumulated gradient
        self._messages = itertools.count()

    def context_id(self) -> int:
        return self.id

    def send_functions(self) -> Dict[int, List[Any]]:
        """The tensors sent from this worker in the context, by message."""
        with self.lock:
            return {m: list(ts) for m, ts in self.sends.items()}

    def recv_functions(self) -> Dict[Tuple[int, int, int], Any]:
        """The graph nodes of the tensors received, by (sender, message, slot)."""
        with self.lock:
            return dict(self.recvs)

    def known_worker_ids(self) -> Set[int]:
        """The ranks this context reached from here (released with it)."""
        with self.lock:
            return set(self.workers)

    def _message(self, dest: int, me: int) -> int:
        with self.lock:
            message = next(self._messages)
            self.sends[message] = []
            if dest != me:
                self.workers.add(dest)
        return message

    def _heard(self, rank: int) -> None:
        with self.lock:
            self.workers.add(rank)

    def _accumulate(self, leaves: Sequence[Any], grads: Sequence[Any]) -> None:
        with self.lock:
            for leaf, grad in zip(leaves, grads):
                if grad is not None:
                    held = self.grads.get(leaf)
                    self.grads[leaf] = grad if held is None else held + grad

    def __repr__(self) -> str:
        return f"Context(id={self.id}, workers={sorted(self.workers)})"


# -- contexts ------------------------------------------------------------------------


def _agent(what: str) -> Any:
    return _current.current(what)


def _unknown(context_id: Any) -> RuntimeError:
    return RuntimeError(f"Could not find autograd context with id: {context_id}")


def retrieve_context(context_id: int) -> Context:
    """This worker's context ``context_id``.

    Raises:
        RuntimeError: no such context here (never made, or released).
    """
    context = _contexts.get(context_id)
    if context is None:
        raise _unknown(context_id)
    return context


def current_context() -> Context:
    """The context of the calling thread (inside ``with context()``, or while
    serving an RPC made inside one).

    Raises:
        RuntimeError: the thread has none.
    """
    context_id = getattr(_local, "context", None)
    if context_id is None:
        raise RuntimeError(
            "Current thread doesn't have a valid autograd context. Please wrap your code "
            "using: `with pycoll.rpc.autograd.context() as context_id` to generate a valid "
            "context"
        )
    return retrieve_context(context_id)


def _joined(context_id: int) -> Context:
    """The context, made here if this worker has not seen it yet."""
    with _lock:
        context = _contexts.get(context_id)
        if context is None:
            context = _contexts[context_id] = Context(context_id)
        return context


@contextlib.contextmanager
def context() -> Iterator[int]:
    """A new distributed autograd context for the calling thread; yields its id.

    The id is unique in the job. Leaving the block releases the context here
    and on every worker it reached.

    Raises:
        RuntimeError: the thread is in a context already (contexts do not
            nest), or RPC is not initialized.
    """
    if getattr(_local, "context", None) is not None:
        raise RuntimeError(
            "Already have an autograd context id for this thread: distributed autograd "
            "contexts do not nest; leave the current one first"
        )
    agent = _agent("pycoll.rpc.autograd.context")
    context_id = (agent.rank << _SHIFT) + next(_counter)
    with _lock:
        _contexts[context_id] = Context(context_id)
    _local.context = context_id
    try:
        yield context_id
    finally:
        _local.context = None
        _release(context_id, agent.rank)


def _release(context_id: int, origin: int) -> None:
    """Drop the context here and pass the release on to the workers it reached."""
    with _lock:
        context = _contexts.pop(context_id, None)
    agent = _current.AGENT
    if context is None or agent is None or not agent.running:
        return
    for rank in sorted(context.known_worker_ids() - {origin, agent.rank}):
        future = agent.call(rank, _release_here, (context_id, agent.rank), None, -1)
        future.add_done_callback(_release_failed)


def _release_here(context_id: int, origin: int) -> None:
    _release(context_id, origin)


def _release_failed(future: Any) -> None:
    try:
        future.value()
    except Exception as exc:  # the peer is gone or stuck: say so, nothing to undo
        warnings.warn(
            f"pycoll.rpc.autograd: a context's release did not reach a worker: {exc}",
            RuntimeWarning,
            stacklevel=1,
        )


_release_here._pycoll_autograd_internal = True  # type: ignore[attr-defined]


# -- what travels ----------------------------------------------------------------------


class _Marker:
    """The first argument of a call made in a context: pickled, it records
    the destination in the context and makes the pickler record the tensors
    that follow; unpickled, it joins the callee to the context."""

    def __init__(self, context_id: int, sender: int) -> None:
        self.context_id = context_id
        self.sender = sender

    def _reduce_for(self, pickler: Any) -> Any:
        context = _joined(self.context_id)
        pickler.autograd = _Outgoing(context, pickler.dest, pickler.me)
        if pickler.dest != pickler.me:
            context._heard(pickler.dest)
        return _arrive, (self.context_id, pickler.me)


def _arrive(context_id: int, sender: int) -> _Marker:
    context = _joined(context_id)
    agent = _current.AGENT
    if agent is not None and sender != agent.rank:
        context._heard(sender)
    return _Marker(context_id, sender)


class _Reply:
    """A result served in a context: pickled, its tensors that require grad
    are recorded in the context as sent back to the caller."""

    def __init__(self, context_id: int, value: Any) -> None:
        self.context_id = context_id
        self.value = value

    def _reduce_for(self, pickler: Any) -> Any:
        context = _contexts.get(self.context_id)
        if context is not None:  # else released meanwhile: the tensors go as plain ones
            pickler.autograd = _Outgoing(context, pickler.dest, pickler.me)
        return _identity, (self.value,)


def _identity(value: Any) -> Any:
    return value


class _Outgoing:
    """One message's record in a context: the tensors it carries that require grad."""

    def __init__(self, context: Context, dest: int, me: int) -> None:
        self.context = context
        self.dest = dest
        self.me = me
        self.message: Optional[int] = None

    def reduce(self, tensor: Any, array: Any, dtype: str) -> Any:
        context = self.context
        if self.message is None:
            self.message = context._message(self.dest, self.me)
        with context.lock:
            sent = context.sends[self.message]
            slot = len(sent)
            sent.append(tensor)
        return _received, (array, dtype, context.id, self.me, self.message, slot)


class _Key:
    """Where a received tensor's gradient goes: the sender, and the message
    and slot it came in; and, until the node is made, the tensor."""

    def __init__(self, context_id: int, sender: int, message: int, slot: int, tensor: Any):
        self.context_id = context_id
        self.sender = sender
        self.message = message
        self.slot = slot
        self.tensor = tensor


def _received(array: Any, dtype: str, context_id: int, sender: int, message: int, slot: int):
    """A tensor that required grad at its sender, rebuilt as the output of a
    _Recv node (as a plain leaf if the context is gone here already)."""
    tensor = wire.rebuild_tensor(array, dtype, False)
    context = _contexts.get(context_id)
    if context is None:
        return tensor.requires_grad_(True)
    with torch.enable_grad():  # the thread unpickling may be in no_grad
        out = _Recv.apply(_ANCHOR, _Key(context_id, sender, message, slot, tensor))
    with context.lock:
        context.recvs[(sender, message, slot)] = out.grad_fn
    return out


class _Recv(torch.autograd.Function):
    """A tensor received in a context; its backward sends the gradient back."""

    @staticmethod
    def forward(ctx: Any, anchor: Any, key: _Key) -> Any:  # noqa: ARG004 (the anchor)
        tensor, key.tensor = key.tensor, None
        ctx.key = key
        return tensor

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        running = getattr(_local, "running", None)
        key = ctx.key
        if running is None:
            raise RuntimeError(
                f"this graph crosses workers through pycoll.rpc (a tensor received from rank "
                f"{key.sender} in distributed autograd context {key.context_id}): run its "
                "backward pass with pycoll.rpc.autograd.backward(context_id, roots), not "
                "torch.autograd.backward or Tensor.backward"
            )
        running.send(key, grad)
        return None, None


# -- the backward pass -----------------------------------------------------------------


class _Pass:
    """One run of the engine on this worker: the gradients it sent on."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.calls: List[Tuple[int, Future]] = []

    def send(self, key: _Key, grad: Any) -> None:
        agent = _agent("pycoll.rpc.autograd.backward")
        future = agent.call(
            key.sender,
            _propagate,
            (key.context_id, key.message, key.slot, grad, _inner(self.budget)),
            None,
            self.budget if self.budget != float("inf") else 0,
        )
        self.calls.append((key.sender, future))


def _leaves(roots: Sequence[Any]) -> List[Any]:
    """The tensors that require grad and have no grad_fn reachable from
    ``roots`` (this worker's leaves), each once."""
    leaves: List[Any] = []
    seen: Set[int] = set()
    stack: List[Any] = []
    for root in roots:
        if root.grad_fn is None:
            if id(root) not in seen:
                seen.add(id(root))
                leaves.append(root)
        else:
            stack.append(root.grad_fn)
    visited: Set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        for child, _ in node.next_functions:
            if child is None:
                continue
            variable = getattr(child, "variable", None)  # an AccumulateGrad node
            if variable is None:
                stack.append(child)
            elif variable is not _ANCHOR and id(variable) not in seen:
                seen.add(id(variable))
                leaves.append(variable)
    return leaves


def _run(
    context: Context, roots: Sequence[Any], grads: Sequence[Any], retain: bool, budget: float
) -> Tuple[List[Tuple[int, Future]], Optional[BaseException]]:
    """Run the engine from ``roots`` on this worker, adding the leaves'
    gradients into ``context``; the calls that carried gradients on, and the
    error that stopped the engine, if one did."""
    leaves = _leaves(roots)
    running = _Pass(budget)
    outer = getattr(_local, "running", None)
    _local.running = running
    try:
        found = torch.autograd.grad(
            roots, leaves + [_ANCHOR], grads, retain_graph=retain, allow_unused=True
        )
    except Exception as exc:
        return running.calls, exc
    finally:
        _local.running = outer
    context._accumulate(leaves, found[: len(leaves)])
    return running.calls, None


def _failure(exc: BaseException, rank: int) -> str:
    """An error in the engine on worker ``rank``, as the root reports it."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    name = _name(rank)
    return f"Error on Node {rank}: {exc}\n(on {name}, in its part of the backward pass)\n{text}"


def _name(rank: int) -> str:
    agent = _current.AGENT
    return agent.workers[rank].name if agent is not None else f"rank {rank}"


def _unanswered(rank: int, exc: BaseException) -> str:
    return (
        f"Error on Node {rank}: the backward pass could not go on through {_name(rank)}: "
        f"{type(exc).__name__}: {exc}"
    )


def _gather(calls: List[Tuple[int, Future]], done: Any) -> None:
    """``done(first error or None)`` once every call has completed."""
    if not calls:
        done(None)
        return
    lock = threading.Lock()
    left = [len(calls)]
    errors: List[str] = []

    def one(rank: int, future: Any) -> None:
        try:
            error = future.value()
        except BaseException as exc:
            error = _unanswered(rank, exc)
        with lock:
            if error is not None:
                errors.append(error)
            left[0] -= 1
            last = left[0] == 0
        if last:
            done(errors[0] if errors else None)

    for rank, future in calls:
        future.add_done_callback(functools.partial(one, rank))


@async_execution
def _propagate(context_id: int, message: int, slot: int, grad: Any, budget: float) -> Future:
    """Served on the sender of a tensor: its gradient arrived; run the engine
    from the tensor sent and reply (None, or the first error's text) once
    everything it reached is done."""
    out = Future()
    agent = _agent("pycoll.rpc.autograd.backward")
    context = _contexts.get(context_id)
    if context is None:
        out.set_result(_failure(_unknown(context_id), agent.rank))
        return out
    with context.lock:
        root = context.sends[message][slot]
    calls, error = _run(context, [root], [grad], True, budget)
    if error is not None:
        failure = _failure(error, agent.rank)
        _gather(calls, lambda _: out.set_result(failure))
    else:
        _gather(calls, out.set_result)
    return out


_propagate._pycoll_autograd_internal = True  # type: ignore[attr-defined]


def _check_roots(roots: Any) -> List[Any]:
    if not isinstance(roots, (list, tuple)) or not all(isinstance(r, torch.Tensor) for r in roots):
        raise TypeError(
            "pycoll.rpc.autograd.backward: roots must be a list of tensors, not "
            f"{type(roots).__name__}"
        )
    if not roots:
        raise RuntimeError("No tensors provided for gradient computation.")
    for root in roots:
        if not root.requires_grad:
            raise RuntimeError(f"requires_grad not set on root: {root}")
        if root.numel() != 1:
            raise RuntimeError(
                f"Tensor of shape {tuple(root.shape)} is not a scalar, all roots need to be scalar"
            )
        if root.grad_fn is None:
            raise RuntimeError(
                f"{root} does not have a valid gradient function: a root must be computed "
                "from tensors that require grad, not be a leaf itself"
            )
    return list(roots)


def backward(
    context_id: int, roots: Sequence[Any], retain_graph: bool = False, *, timeout: float = -1
) -> None:
    """Run the backward pass from ``roots`` across every worker the forward
    pass went through in context ``context_id``.

    Each worker adds the gradients of its own leaves into the context (read
    them with :func:`get_gradients` there); ``.grad`` is not touched. Returns
    once every worker reached is done.

    Args:
        context_id: the id ``context()`` yielded.
        roots: scalar tensors computed in the context (a loss).
        retain_graph: keep this worker's graph for another backward, as
            torch.autograd.backward. The parts on other workers are kept
            until the context is released.
        timeout: seconds each worker may take for its part, the next ones
            down a chain included (-1: the RPC timeout; 0: none). A worker
            that stops answering is named in the error within it.

    Raises:
        TypeError: ``context_id`` is not an int or ``roots`` not a list of tensors.
        RuntimeError: the context is unknown here (never made, or released);
            a root is not a scalar, does not require grad or is a leaf; the
            backward pass failed on a worker ("Error on Node <rank>: ...", the
            worker's error and where it came from).
    """
    if isinstance(context_id, bool) or not isinstance(context_id, int):
        raise TypeError(
            "pycoll.rpc.autograd.backward: context_id must be the int that context() yields, "
            f"not {type(context_id).__name__}"
        )
    roots = _check_roots(roots)
    agent = _agent("pycoll.rpc.autograd.backward")
    context = retrieve_context(context_id)
    budget = agent.seconds(timeout, "pycoll.rpc.autograd.backward")
    calls, error = _run(context, roots, [None] * len(roots), retain_graph, budget)
    errors: List[str] = []
    for rank, future in calls:  # each bounded by its call's timeout
        try:
            failure = future.wait()
        except BaseException as exc:
            failure = _unanswered(rank, exc)
        if failure is not None:
            errors.append(failure)
    if error is not None:
        raise error
    if errors:
        more = f"\n({len(errors) - 1} more workers failed)" if len(errors) > 1 else ""
        raise RuntimeError(errors[0] + more)


def get_gradients(context_id: int) -> Dict[Any, Any]:
    """This worker's gradients in context ``context_id``: a dict from each of
    its leaf tensors the backward pass reached to its accumulated gradient.

    Raises:
        RuntimeError: the context is unknown here (never made, or released).
    """
    context = retrieve_context(context_id)
    with context.lock:
        return dict(context.grads)


# -- calls made in a context -----------------------------------------------------------


def _serve(marker: _Marker, reply: bool, func: Any, args: Any, kwargs: Any) -> Any:
    """Run a call in the caller's context (the callee's side)."""
    with _entered(marker.context_id):
        value = func(*args, **kwargs)
    return _Reply(marker.context_id, value) if reply else value


@async_execution
def _serve_async(marker: _Marker, reply: bool, func: Any, args: Any, kwargs: Any) -> Any:
    """_serve for an @async_execution function: the reply waits for its Future."""
    with _entered(marker.context_id):
        pending = func(*args, **kwargs)
    if not reply:
        return pending
    out = Future()

    def settle(value: Any, error: Optional[BaseException]) -> None:
        if error is None:
            out.set_result(_Reply(marker.context_id, value))
        else:
            out.set_exception(error)

    when_done(pending, settle)
    return out


for _internal in (_serve, _serve_async):
    _internal._pycoll_autograd_internal = True  # type: ignore[attr-defined]


@contextlib.contextmanager
def _entered(context_id: int) -> Iterator[None]:
    outer = getattr(_local, "context", None)
    _local.context = context_id
    try:
        yield
    finally:
        _local.context = outer


def _carry(dest: int, func: Any, args: Any, kwargs: Any, remote: bool) -> Any:
    """pycoll.rpc's hook (current.AUTOGRAD): a call made in a context is sent
    as a call of _serve, which runs it in the same context on the callee."""
    context_id = getattr(_local, "context", None)
    if context_id is None or getattr(func, "_pycoll_autograd_internal", False):
        return func, args, kwargs
    agent = _current.AGENT
    serve = _serve_async if is_async(func) else _serve
    marker = _Marker(context_id, agent.rank if agent is not None else -1)
    return serve, (marker, not remote, func, tuple(args or ()), dict(kwargs or {})), None


_current.AUTOGRAD = _carry
