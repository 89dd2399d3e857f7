"""DistributedOptimizer: one optimizer step over parameters held on several
workers, with the gradients of a distributed autograd context
(torch.distributed.optim.DistributedOptimizer's names and semantics).

    opt = DistributedOptimizer(torch.optim.SGD, param_rrefs, lr=0.05)
    with dist_autograd.context() as context_id:
        loss = model(batch).sum()
        dist_autograd.backward(context_id, [loss])
        opt.step(context_id)

Each worker owning parameters gets one local optimizer (made there by
``remote``); ``step`` asks each, in parallel, to take its gradients from the
context (pycoll.rpc.autograd.get_gradients) and step. torch is required.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List

from . import autograd as dist_autograd  # first: it says how to install torch if it is missing
from .api import remote, rpc_async
from .rref import RRef

__all__ = ["DistributedOptimizer"]


class _LocalOptimizer:
    """The optimizer of one worker's parameters (lives on that worker)."""

    def __init__(self, optimizer_class: Any, params: List[RRef], *args: Any, **kwargs: Any):
        self.params = [p.local_value() for p in params]
        self.optimizer = optimizer_class(self.params, *args, **kwargs)
        self.lock = threading.Lock()  # steps from several trainers take turns

    def step(self, context_id: int) -> None:
        grads = dist_autograd.get_gradients(context_id)
        with self.lock:
            for param in self.params:
                # A parameter the context's backward did not reach has no
                # gradient in it: it is left alone (not stepped with a stale .grad).
                param.grad = grads.get(param)
            self.optimizer.step()


def _make(optimizer_class: Any, params: List[RRef], args: Any, kwargs: Any) -> _LocalOptimizer:
    return _LocalOptimizer(optimizer_class, params, *args, **kwargs)


def _step(local: RRef, context_id: int) -> None:
    local.local_value().step(context_id)


class DistributedOptimizer:
    """An optimizer over parameters on several workers, given as RRefs.

    Args:
        optimizer_class: a torch.optim optimizer class (made on each owner).
        params_rref: RRefs of the parameters (``RRef(param)`` for local ones).
        *args, **kwargs: passed to ``optimizer_class`` on every owner.

    Raises:
        TypeError: ``params_rref`` is not a list of RRefs.
    """

    def __init__(
        self, optimizer_class: Any, params_rref: List[RRef], *args: Any, **kwargs: Any
    ) -> None:
        if not isinstance(params_rref, (list, tuple)) or not all(
            isinstance(p, RRef) for p in params_rref
        ):
            raise TypeError(
                "DistributedOptimizer: params_rref must be a list of RRefs to parameters "
                "(RRef(param) for this worker's own)"
            )
        by_owner: Dict[Any, List[RRef]] = {}
        for p in params_rref:
            by_owner.setdefault(p.owner(), []).append(p)
        self.optimizers = [
            remote(owner, _make, args=(optimizer_class, params, args, kwargs))
            for owner, params in by_owner.items()
        ]

    def step(self, context_id: int) -> None:
        """One step of every owner's optimizer with its gradients in context
        ``context_id``; returns when all have stepped.

        Raises:
            RuntimeError: a step failed on one or more workers (each named).
        """
        futures = [
            (o.owner(), rpc_async(o.owner(), _step, args=(o, context_id))) for o in self.optimizers
        ]
        errors = []
        for owner, future in futures:
            try:
                future.wait()
            except Exception as exc:
                errors.append(f"{owner.name}: {exc}")
        if errors:
            raise RuntimeError(
                "DistributedOptimizer.step failed on "
                + str(len(errors))
                + " worker(s):\n"
                + "\n".join(errors)
            )
