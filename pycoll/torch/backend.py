"""ProcessGroupPycoll: torch.distributed's process group over pycoll.

torch calls :func:`create` (registered by pycoll.torch) on the members of
each group it makes with the backend "pycoll". The group it returns is a
``torch.distributed.ProcessGroup`` subclass (what torch 2.13 takes from a
Python backend) whose every method runs pycoll's collective of the same
meaning on a pycoll group of the same ranks, so torch's API gets pycoll's
whole house: MPI's algorithms and pycoll's own, the numba kernels for
float16/bfloat16/AVG/PREMUL_SUM, the device door for CUDA tensors, sequence
numbers, the call check, bounded waits with a diagnosis.

- The default group runs on pycoll's default group (started here, over
  COMM_WORLD, when the program has not started pycoll itself); any other on
  a group made by its members alone (``pycoll.new_group`` with
  ``use_local_synchronization=True``: MPI_Comm_create_group), from torch's
  ``global_ranks_in_group``, since torch calls the creator on members only.
- torch passes group ranks (roots, peers); pycoll's API takes global ranks:
  they are translated here.
- A call torch makes synchronously (``asyncOp=False``: ``dist.all_reduce``
  without ``async_op``) runs pycoll's synchronous path and returns a
  completed Work; any other returns at once a :class:`TorchWork` over
  pycoll's nonblocking one (DDP's buckets, ``async_op=True``).
- Each group has a second pycoll group of the same ranks for the collectives
  issued from the future completer's thread (comm hooks' callbacks): see
  pycoll.torch.work.
"""

from __future__ import annotations

import os
import sys
import types
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout
from torch.distributed.distributed_c10d import AllgatherOptions  # (not in torch.distributed)

import pycoll

from ..groups import ProcessGroup as PycollGroup
from ..torchcompat import host_view, kept_view, lane_op, reduce_op
from . import sparse
from .errors import as_torch
from .work import COMPLETER, TorchWork, done

__all__ = ["ProcessGroupPycoll", "create", "NAME"]

NAME = "pycoll"

# Whether pycoll's default group was started by this module (then destroying
# torch's default group ends it too) rather than by the program.
_STARTED_HERE = [False]


def _array(t: Any, func: str, label: str) -> Any:
    """What pycoll's API takes for a tensor: a numpy view of a CPU tensor's
    memory (no copy; the kept one for a tensor seen before, found first), a
    CUDA tensor as it is (the device door takes it)."""
    view = kept_view(t)
    if view is not None:
        return view
    return host_view(t, func, label) if t.is_cpu else t


# The plain op kinds met so far, by the hash of the ReduceOp that carried
# them: (the kind, pycoll's op). The options give a new ReduceOp object at
# each read, and its ``.op`` and that kind's hash cost 1.2 us through torch's
# binding (3.5 us for this function on the CI VM); the ReduceOp's own hash is
# the kind's number, and ``op == kind`` confirms a hit (0.5 us in all). A
# premul sum is never here: it carries its own factor.
_KINDS: Dict[int, Tuple[Any, Any]] = {}


def _op(op: Any, func: str) -> Any:
    """torch's ReduceOp (as the options carry it) as pycoll's: its kind's,
    known once met (a premul sum carries its own factor: made each time)."""
    known = _KINDS.get(hash(op))
    if known is not None and op == known[0]:
        return known[1]
    kind = getattr(op, "op", op)
    mine = lane_op(kind)
    if mine is None:
        return reduce_op(kind if getattr(kind, "name", None) != "PREMUL_SUM" else op, func)
    _KINDS[hash(op)] = (kind, mine)
    return mine


# What a synchronous call returns: torch waits on it at once and drops it.
_DONE = done([])


def _arrays(tensors: List[Any], func: str, name: str) -> List[Any]:
    """:func:`_array` of each tensor of a list, named ``name[i]`` in errors."""
    return [_array(t, func, f"{name}[{i}]") for i, t in enumerate(tensors)]


def _all_cpu(outputs: List[Any], inputs: List[Any]) -> bool:
    """Whether a coalesced call's tensors are all on the CPU: then it is one
    pycoll call (pycoll.collectives.coalesced); CUDA tensors go one pair at a
    time, through the device layer."""
    return all(t.is_cpu for t in outputs) and all(t.is_cpu for t in inputs)


# What torch's options carry for a call with no timeout of its own is
# negative (kUnsetTimeout); a call's own is positive.
_NO_TIMEOUT = timedelta(0)


def _reraise(exc: BaseException) -> None:
    mapped = as_torch(exc)
    if mapped is None:
        raise exc
    raise mapped from None


def _tensor_pairs(func: str, labels: Any, options: Callable[[], Any], reduces: bool) -> Any:
    """The group's method for lists of (output, input) tensor pairs of pycoll's
    ``func`` (``func`` for one pair, ``func_coalesced`` for the list: see
    ``ProcessGroupPycoll._each``), reducing with the options' op where
    ``reduces``."""
    one, together = getattr(pycoll, func), getattr(pycoll, f"{func}_coalesced")

    def method(
        self: ProcessGroupPycoll,
        outputs: List[torch.Tensor],
        inputs: List[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        opts = opts if opts is not None else options()
        extra = (_op(opts.reduceOp, func),) if reduces else ()
        return self._each(opts, outputs, inputs, func, labels, one, together, *extra)

    return method


def _one_pair(pairs: str) -> Any:
    """The group's method for one (output, input) pair: its method ``pairs``
    on a list of one."""

    def method(
        self: ProcessGroupPycoll, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> TorchWork:
        return getattr(self, pairs)([output], [input], opts)

    return method


class ProcessGroupPycoll(dist.ProcessGroup):
    """A torch process group whose operations run on pycoll over MPI.

    Made by torch through the backend "pycoll" (``init_process_group``,
    ``new_group``...), not by hand.

    Args:
        group: the pycoll group the operations run on.
        side: a second pycoll group of the same ranks, for operations issued
            from the future completer's thread.
        owns: pycoll groups to destroy when torch shuts this group down.
    """

    def __init__(self, group: PycollGroup, side: PycollGroup, owns: List[PycollGroup]) -> None:
        super().__init__(group.rank(), group.size())
        self._group = group
        self._side = side
        self._owns = owns
        self._globals = group.ranks  # group rank -> global rank
        self._local = {g: i for i, g in enumerate(self._globals)}
        self._closed = False
        self._name = group.group_name
        self._desc = group.group_desc
        # Each channel's timeout in seconds, for the point-to-point Works
        # (read here once: torch waits on a Work for every send and recv).
        self._limits = (group.timeout.total_seconds(), side.timeout.total_seconds())

    # -- what torch asks of a backend -------------------------------------------

    def getBackendName(self) -> str:
        return NAME

    @property
    def pycoll_group(self) -> PycollGroup:
        """The pycoll group this group's operations run on (for pycoll's own
        API on the same ranks: ``pycoll.all_reduce(x, group=g.pycoll_group)``)."""
        return self._group

    # torch names each group after making it; a Python group keeps the names
    # itself (torch's C++ getters ask a C++ backend, which this group has not).
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return self._desc

    def _get_sequence_number_for_group(self) -> int:
        """How many collectives this rank has issued on the group (pycoll's count)."""
        return self._group.sequence_number() + self._side.sequence_number()

    def __repr__(self) -> str:
        return f"ProcessGroupPycoll(rank={self.rank()}, size={self.size()}, on={self._group!r})"

    # -- the common path -----------------------------------------------------------

    def _channel(self) -> PycollGroup:
        return self._side if COMPLETER.is_own_thread() else self._group

    def _run(self, opts: Any, value: List[Any], fn: Callable[..., Any], *args: Any) -> TorchWork:
        """``fn(*args, group, async_op)``, pycoll's collective on this group's
        channel: synchronously where torch waits at once (``asyncOp`` False,
        no timeout of the call's own), returning the shared completed Work;
        else nonblocking, a TorchWork over pycoll's Work (or list of them).
        Errors in torch's family. (Positional, without a closure: this is
        every call's path, and each step costs a few tenths of a
        microsecond; docs/measurements/backend_calls.py.)"""
        group = self._side if COMPLETER.is_own_thread() else self._group
        timeout = opts.timeout
        own = None if timeout <= _NO_TIMEOUT else timeout.total_seconds()
        try:
            # (getattr: an older torch's options have no asyncOp; there every
            # call returns a Work, which torch waits on.)
            if own is None and getattr(opts, "asyncOp", True) is False:
                fn(*args, group, False)
                return _DONE
            work = fn(*args, group, True)
        except Exception as exc:
            _reraise(exc)
        return TorchWork(work if isinstance(work, list) else [work], value, group, own)

    def _each(
        self,
        opts: Any,
        outputs: List[torch.Tensor],
        inputs: List[torch.Tensor],
        func: str,
        labels: Any,
        one: Callable[..., Any],
        together: Callable[..., Any],
        *extra: Any,
    ) -> TorchWork:
        """A coalesced call: ``together(outputs, inputs, *extra, group,
        async_op)``, one pycoll call for the whole list
        (pycoll.collectives.coalesced), where every tensor is on the CPU;
        else ``one(output, input, *extra, group, async_op)`` per pair (CUDA
        tensors go through the device layer). One Work either way."""
        if len(inputs) > 1 and _all_cpu(outputs, inputs):
            name = f"{func}_coalesced"
            outs = _arrays(outputs, name, "outputs")
            ins = _arrays(inputs, name, "inputs")
            return self._run(opts, outputs, together, outs, ins, *extra)
        if len(inputs) == 1:
            out = _array(outputs[0], func, labels[0])
            x = _array(inputs[0], func, labels[1])
            return self._run(opts, outputs, one, out, x, *extra)
        pairs = [
            (_array(o, func, labels[0]), _array(i, func, labels[1]))
            for o, i in zip(outputs, inputs)
        ]

        def each(group: PycollGroup, async_op: bool) -> Any:
            works = [one(o, i, *extra, group, async_op) for o, i in pairs]
            return works if async_op else None

        return self._run(opts, outputs, each)

    def _p2p(
        self, value: List[Any], fn: Callable[..., Any], x: Any, peer: int, tag: int
    ) -> TorchWork:
        """``fn(x, peer, group, tag)``: pycoll's isend or irecv on this
        group's channel, as a TorchWork (torch waits on it, even for
        dist.send)."""
        side = COMPLETER.is_own_thread()
        group = self._side if side else self._group
        try:
            work = fn(x, peer, group, tag)
        except Exception as exc:
            _reraise(exc)
        return TorchWork([work], value, None, self._limits[side])

    def _root(self, opts: Any) -> int:
        return self._globals[opts.rootRank]

    # -- reductions ------------------------------------------------------------------

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> TorchWork:
        opts = opts if opts is not None else dist.AllreduceOptions()
        op = _op(opts.reduceOp, "all_reduce")
        if len(tensors) == 1 and tensors[0].layout == torch.sparse_coo:
            try:  # (synchronous: see pycoll.torch.sparse)
                sparse.all_reduce(tensors[0], op, self._channel())
            except Exception as exc:
                _reraise(exc)
            return done(tensors)
        if len(tensors) == 1:
            x = _array(tensors[0], "all_reduce", "tensor")
            return self._run(opts, tensors, pycoll.all_reduce, x, op)
        xs = _arrays(tensors, "all_reduce", "tensors")
        return self._run(opts, tensors, pycoll.all_reduce_coalesced, xs, op)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> TorchWork:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        op = _op(opts.reduceOp, "all_reduce_coalesced")
        xs = _arrays(tensors, "all_reduce_coalesced", "tensors")
        return self._run(opts, tensors, pycoll.all_reduce_coalesced, xs, op)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> TorchWork:
        opts = opts if opts is not None else dist.ReduceOptions()
        op = _op(opts.reduceOp, "reduce")
        x = _array(tensors[0], "reduce", "tensor")
        return self._run(opts, tensors, pycoll.reduce, x, self._root(opts), op)

    def reduce_scatter(
        self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None
    ) -> TorchWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = _op(opts.reduceOp, "reduce_scatter")
        out = _array(outputs[0], "reduce_scatter", "output")
        ins = _arrays(input_lists[0], "reduce_scatter", "input_list")
        return self._run(opts, outputs, pycoll.reduce_scatter, out, ins, op)

    # reduce_scatter_tensor's lists, and a list of one (_reduce_scatter_base)
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced = _tensor_pairs(
        "reduce_scatter_tensor", ("output", "input"), dist.ReduceScatterOptions, True
    )
    reduce_scatter_single = _reduce_scatter_base = _one_pair("reduce_scatter_single_coalesced")

    # -- copies ----------------------------------------------------------------------

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> TorchWork:
        opts = opts if opts is not None else dist.BroadcastOptions()
        x = _array(tensors[0], "broadcast", "tensor")
        return self._run(opts, tensors, pycoll.broadcast, x, self._root(opts))

    def allgather(
        self,
        output_lists: List[List[torch.Tensor]],
        inputs: List[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        opts = opts if opts is not None else AllgatherOptions()
        outs = _arrays(output_lists[0], "all_gather", "tensor_list")
        x = _array(inputs[0], "all_gather", "tensor")
        return self._run(opts, output_lists, pycoll.all_gather, outs, x)

    def allgather_coalesced(
        self,
        output_lists: List[List[torch.Tensor]],
        inputs: List[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        opts = opts if opts is not None else AllgatherOptions()
        func = "all_gather_coalesced"
        outs = [[_array(t, func, "output") for t in row] for row in output_lists]
        xs = [_array(t, func, "input") for t in inputs]
        return self._run(opts, output_lists, pycoll.all_gather_coalesced, outs, xs)

    # all_gather_into_tensor's lists, and a list of one (_allgather_base)
    all_gather_single_coalesced = allgather_into_tensor_coalesced = _tensor_pairs(
        "all_gather_into_tensor", ("output_tensor", "input_tensor"), AllgatherOptions, False
    )
    all_gather_single = _allgather_base = _one_pair("all_gather_single_coalesced")

    def gather(
        self,
        output_lists: List[List[torch.Tensor]],
        inputs: List[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        opts = opts if opts is not None else dist.GatherOptions()
        outs = _arrays(output_lists[0], "gather", "gather_list") if output_lists else None
        x = _array(inputs[0], "gather", "tensor")
        return self._run(opts, output_lists, pycoll.gather, x, outs, self._root(opts))

    def scatter(
        self,
        outputs: List[torch.Tensor],
        input_lists: List[List[torch.Tensor]],
        opts: Any = None,
    ) -> TorchWork:
        opts = opts if opts is not None else dist.ScatterOptions()
        ins = _arrays(input_lists[0], "scatter", "scatter_list") if input_lists else None
        out = _array(outputs[0], "scatter", "tensor")
        return self._run(opts, outputs, pycoll.scatter, out, ins, self._root(opts))

    def alltoall(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> TorchWork:
        opts = opts if opts is not None else dist.AllToAllOptions()
        outs = _arrays(outputs, "all_to_all", "output_tensor_list")
        ins = _arrays(inputs, "all_to_all", "input_tensor_list")
        return self._run(opts, outputs, pycoll.all_to_all, outs, ins)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: List[int],
        input_split_sizes: List[int],
        opts: Any = None,
    ) -> TorchWork:
        opts = opts if opts is not None else dist.AllToAllOptions()
        out = _array(output, "all_to_all_single", "output")
        x = _array(input, "all_to_all_single", "input")
        out_splits = list(output_split_sizes) or None
        in_splits = list(input_split_sizes) or None
        return self._run(opts, [output], pycoll.all_to_all_single, out, x, out_splits, in_splits)

    alltoall_base = all_to_all_single

    # -- synchronization ---------------------------------------------------------------

    def barrier(self, opts: Any = None) -> TorchWork:
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._run(opts, [], pycoll.barrier)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """pycoll's monitored_barrier: rank 0 names the ranks that did not
        arrive within ``timeout``. (``torch.distributed.monitored_barrier``
        itself accepts only gloo groups; call this method, or
        ``pycoll.monitored_barrier(group=g.pycoll_group)``.)"""
        try:
            pycoll.monitored_barrier(
                group=self._channel(), timeout=timeout, wait_all_ranks=wait_all_ranks
            )
        except Exception as exc:
            _reraise(exc)

    # -- point to point ------------------------------------------------------------------

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> TorchWork:
        x = _array(tensors[0], "send", "tensor")
        return self._p2p(tensors, pycoll.isend, x, self._globals[dst], tag)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> TorchWork:
        x = _array(tensors[0], "recv", "tensor")
        return self._p2p(tensors, pycoll.irecv, x, self._globals[src], tag)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> TorchWork:
        x = _array(tensors[0], "recv", "tensor")
        group = self._channel()
        try:
            work = pycoll.irecv(x, None, group=group, tag=tag)
        except Exception as exc:
            _reraise(exc)
        assert work is not None  # a member's receive
        limit = group.timeout.total_seconds()
        return TorchWork([work], tensors, None, limit, source=self._local.__getitem__)

    # -- the end -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Destroy the pycoll groups under this one (torch calls it from
        destroy_process_group); pycoll itself ends with torch's default group
        when this module started it.

        A disagreement the call check finds here (pycoll.crosscheck.final) is
        written to stderr, not raised: torch's destroy_process_group clears
        its own state only after every backend's shutdown has returned, so a
        raise would leave torch half torn down (no new init_process_group).
        """
        if self._closed:
            return
        self._closed = True
        rank = pycoll.get_rank()
        groups: List[Optional[PycollGroup]] = list(self._owns)
        if self._group is pycoll.group.WORLD and _STARTED_HERE[0]:
            _STARTED_HERE[0] = False
            groups.append(None)  # pycoll's default group, last
        for group in groups:
            try:
                pycoll.destroy_process_group(group)
            except pycoll.CollectiveMismatchError as exc:
                sys.stderr.write(f"pycoll: rank {rank}: destroy_process_group: {exc}\n")
                sys.stderr.flush()

    def abort(self) -> None:
        self.shutdown()


def _run_eagerly_under_compile(cls: type) -> None:
    """Make torch.compile call the group's methods instead of tracing them.

    torch's own groups are C++, so dynamo graph-breaks at their methods; a
    Python group's methods it would inline, and fail on the first attribute
    its opaque ProcessGroup type does not declare ("Member '_run' is not
    registered for this opaque object type"): ``dist.all_reduce(x,
    async_op=True)`` or ``dist.broadcast`` inside a compiled function would
    raise instead of running. This is ``torch.compiler.disable`` without its
    wrapper and without importing dynamo (1.8 s) at ``import torch``: each
    method is marked as one dynamo must not inline, and its frame, with all
    it calls, as one dynamo skips. Both are no-ops until dynamo runs; where
    this torch lacks the frame API, only the mark is set.
    """
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )

        skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    except (ImportError, AttributeError):  # pragma: no cover - another torch
        set_code_exec_strategy = skip = None
    for name, value in vars(cls).items():
        if isinstance(value, types.FunctionType) and not name.startswith("__"):
            setattr(value, "_torchdynamo_disable", True)  # noqa: B010 - dynamo's mark
            setattr(value, "_torchdynamo_disable_msg", "pycoll's ProcessGroup runs eagerly")  # noqa: B010
            if skip is not None:
                set_code_exec_strategy(value.__code__, skip)


_run_eagerly_under_compile(ProcessGroupPycoll)


def torch_timeout(timeout: Any) -> Optional[timedelta]:
    """The timeout torch gives a group, or None where it is torch's default
    (so that ``PYCOLL_TIMEOUT``, where set, or pycoll's default applies: torch
    cannot tell a default from a choice)."""
    if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
        return None
    if timeout == default_pg_timeout:
        return None
    return timeout


def world_group(timeout: Optional[timedelta]) -> PycollGroup:
    """pycoll's default group, started over COMM_WORLD if the program has not."""
    world = pycoll.group.WORLD
    if world is None:
        debug = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").strip()
        lend = bool(debug) and not os.environ.get("PYCOLL_DEBUG")
        if lend:  # DETAIL: pycoll's call check; for this start only (torch's may change)
            os.environ["PYCOLL_DEBUG"] = debug
        try:
            pycoll.init_process_group(timeout=timeout)
        finally:
            if lend:
                del os.environ["PYCOLL_DEBUG"]
        _STARTED_HERE[0] = True
        world = pycoll.group.WORLD
    assert world is not None
    return world


def _members_group(members: List[int], timeout: Optional[timedelta], desc: str) -> PycollGroup:
    """A pycoll group of ``members`` made by them alone (MPI_Comm_create_group)."""
    group = pycoll.new_group(
        members, timeout=timeout, use_local_synchronization=True, group_desc=desc
    )
    assert isinstance(group, PycollGroup)  # this rank is a member
    return group


def create(dist_opts: Any, options: Any = None) -> ProcessGroupPycoll:
    """torch's creator for the backend "pycoll" (``extended_api=True``): the
    group of ``dist_opts.global_ranks_in_group`` (the whole world where
    empty), on this rank, which torch says is ``dist_opts.group_rank`` of
    ``dist_opts.group_size``.

    Raises:
        ValueError: torch's rank or size for the group disagrees with MPI's.
    """
    timeout = torch_timeout(dist_opts.timeout)
    world = world_group(timeout)
    members = list(dist_opts.global_ranks_in_group)
    name = str(dist_opts.group_id)
    everyone = list(range(world.size()))
    if not members:
        if (dist_opts.group_rank, dist_opts.group_size) != (world.rank(), world.size()):
            raise ValueError(
                f"init_process_group: torch was told rank {dist_opts.group_rank} of "
                f"{dist_opts.group_size}, but MPI started this process as rank "
                f"{world.rank()} of {world.size()}; leave rank and world_size out (and "
                f"RANK/WORLD_SIZE unset) to take them from MPI, or launch "
                f"{dist_opts.group_size} processes"
            )
        group = world
        owns: List[PycollGroup] = []
    else:
        group = _members_group(members, timeout, f"torch:{name}")
        owns = [group]
    side = _members_group(members or everyone, timeout or group.timeout, f"torch:{name}:callbacks")
    owns.insert(0, side)
    return ProcessGroupPycoll(group, side, owns)
