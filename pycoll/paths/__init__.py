"""Paths: the algorithms a reduction can take, and the one place that picks.

A large all_reduce, reduce-scatter or reduce can go by MPI's own call or by
one of pycoll's paths (the ring, the node's shared window, recursive
doubling, the pairwise exchange, the reduce to a root, a reduce-scatter then
a gather). Each path is registered once, beside its code
(:func:`register`): its name, the collectives it serves, which calls it can
carry, and how it starts. :func:`choose` asks the deciders in one order:

1. the group's tuning table (``PYCOLL_TUNING``, pycoll.tuning), from its
   first size;
2. the live trials (pycoll.autotune), for the ops MPI carries whole, from
   their first size;
3. the built-in rule (:mod:`pycoll.paths.rule`: measured sizes, as data);
4. else MPI's own call.

A path that cannot carry the call (an AVG of integers, device memory, ranks
on different nodes for the window) is passed over. What MPI's own call
becomes is the collective's business: a call seen before is replayed
compiled (pycoll.native) or as a persistent plan (pycoll.persistent), and on
two ranks small calls may be pycoll's exchange (pycoll.collectives.pair).

``python -m pycoll.paths all_reduce float32 16MiB --ranks 4`` says which path
a call would take and why; a recorded timeline (pycoll.trace) gives each
call's path.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from .. import _mpi, autotune, kernels, tuning
from ..ops import Plan, order_matters
from . import rule

__all__ = [
    "Call",
    "Choice",
    "Path",
    "by_rule",
    "choose",
    "explain",
    "family",
    "path",
    "register",
    "registered",
]


class Call(NamedTuple):
    """What the deciders read of a call."""

    func: str  # the collective: all_reduce, reduce_scatter_tensor, reduce_scatter, reduce
    op: str  # its ReduceOp's name
    dtype: np.dtype
    nbytes: int  # its bytes (a reduce-scatter's: its input's)
    ranks: int  # the group's size
    how: Plan  # how the op is carried out for the dtype (pycoll.ops.plan)
    device: bool = False  # its arrays alias device memory (a CUDA-aware MPI's call)

    @property
    def split(self) -> bool:
        return bool(self.how.split)

    @property
    def average(self) -> bool:
        return bool(self.how.average)


class Path(NamedTuple):
    """A registered path: ``carries(call)`` says whether it can carry the
    call at all; ``window(pg, call)``, for a path through the node's shared
    memory, gives the group's window (made on its first call, collectively)
    or None; ``start`` starts it (each collective's paths take its own
    arguments). A ``form`` is what MPI's own call becomes where it applies
    (the two-rank exchange): the collective asks it inline, after
    :func:`choose`, and :func:`explain` lists it."""

    name: str
    funcs: Tuple[str, ...]
    carries: Callable[[Call], bool]
    start: Callable[..., Any]
    window: Optional[Callable[[Any, Call], Any]] = None
    summary: str = ""
    form: bool = False  # a form MPI's own call takes (the collective asks it, inline)
    trials: Optional[Callable[[Call], bool]] = None  # where the live trials time it (None: all)


class Choice(NamedTuple):
    """The path :func:`choose` picked (``"mpi"``: MPI's own call), the
    group's window where it is the window, the live trial's token where the
    call is one (pycoll.autotune.timed takes it), which decider picked it
    (``"table"``, ``"trials"`` or ``"rule"``) and why."""

    name: str
    win: Any
    trial: Any
    by: str
    why: str


_REGISTRY: Dict[str, Dict[str, Path]] = {}


def register(path: Path) -> Path:
    """Register ``path`` for each collective it serves (once: a second path
    of the same name for a collective is a mistake in pycoll)."""
    for func in path.funcs:
        paths = _REGISTRY.setdefault(func, {})
        if path.name in paths:
            raise RuntimeError(f"pycoll.paths: a second {path.name!r} path for {func}")
        paths[path.name] = path
    return path


def registered(func: str) -> Dict[str, Path]:
    """The paths registered for ``func``, by name."""
    return dict(_REGISTRY.get(func, {}))


def path(func: str, name: str) -> Path:
    """The path ``name`` registered for ``func``."""
    return _REGISTRY[func][name]


def family(func: str) -> str:
    """The name the tuning table and the rule know ``func`` by."""
    return "reduce_scatter" if func.startswith("reduce_scatter") else func


def own_carries(c: Call) -> bool:
    """Whether pycoll's own paths over point-to-point messages (the ring, the
    doubling, the pairwise exchange, the reduce to a root) can carry the
    call: more than one rank, an AVG's division in the kernels' last fold
    (real floats only), host memory, and an MPI with MPI_Isendrecv (MPI-4.0),
    their messages' call."""
    return (
        c.ranks > 1
        and not c.device
        and (not c.average or kernels.divides(c.dtype))
        and _mpi.has("MPI_Isendrecv")
    )


def window_carries(c: Call) -> bool:
    """Whether the node's shared window can carry the call, where the group
    has one: more than one rank, host memory, an AVG's division in the
    kernels' last sum."""
    return c.ranks > 1 and not c.device and (not c.average or kernels.divides(c.dtype))


def tried(c: Call) -> bool:
    """Whether a call of the live trials' sizes is theirs to decide: an op
    MPI carries whole, but MIN or MAX of floats (whose bits the paths' orders
    of folding change), and host memory (only MPI's call carries device
    memory)."""
    return bool(c.how.plain) and not order_matters(c.op, c.dtype) and not c.device


def _ready(pg: Any, c: Call, name: str) -> Tuple[bool, Any]:
    """Whether the path ``name`` can carry the call on this group, and its
    window where it is the window (None: no shared window here)."""
    path = _REGISTRY.get(c.func, {}).get(name)
    if path is None or not path.carries(c):
        return False, None
    if path.window is None:
        return True, None
    win = path.window(pg, c) if pg is not None else True
    return win is not None, win


def _tables(pg: Any, c: Call) -> Tuple[int, Any]:
    """The group's tuning entries for the call's collective: their first
    size (tuning.NEVER: none) and the entries."""
    name = family(c.func)
    if name in tuning.COLLECTIVES:
        return pg.tuned(name)
    return tuning.NEVER, None


def choose(pg: Any, c: Call) -> Choice:
    """The path of the call ``c`` on the group ``pg``: the deciders in their
    order (the module's docstring). Collective on the window's first call
    (every rank makes it) and on a live trial's (its decision is exchanged)."""
    least, entries = _tables(pg, c)
    if c.nbytes >= least:
        wanted = tuning.path(entries, c.nbytes)
        ok, win = _ready(pg, c, wanted) if wanted != "mpi" else (False, None)
        why = f"the tuning table ({tuning.ENV}) names {wanted} for {rule.size(c.nbytes)}"
        if ok:
            return Choice(wanted, win, None, "table", why)
        # Where it keeps MPI's call (or its path cannot carry this one), an
        # all_reduce of MPI's own ops follows it and the others the rule (MPI
        # runs them as user ops, which pycoll's paths beat the more); a
        # reduce-scatter takes MPI's call whatever its op.
        if c.how.plain and c.how.builtin or family(c.func) == "reduce_scatter":
            return Choice("mpi", None, None, "table", why)
    elif c.nbytes >= pg.live_from() and family(c.func) in tuning.COLLECTIVES and tried(c):
        func = c.func
        wanted, trial = autotune.trials(pg).choose(
            pg, func, (func, c.how.key, c.nbytes.bit_length()), lambda: candidates(pg, c)
        )
        ok, win = _ready(pg, c, wanted) if wanted != "mpi" else (False, None)
        why = "the live trials (pycoll.autotune)"
        return Choice(wanted if ok else "mpi", win, trial, "trials", why)
    taken = _rule(pg, c)
    if taken is not None:
        return Choice(taken[0], taken[2], None, "rule", taken[1])
    return Choice("mpi", None, None, "rule", "no path of pycoll's takes it: MPI's own call")


def by_rule(c: Call) -> Tuple[str, str]:
    """The built-in rule's path for the call on a group whose ranks share
    one node, and why (``"mpi"``: none of pycoll's takes it); nothing is
    made or sent."""
    taken = _rule(None, c)
    return (taken[0], taken[1]) if taken is not None else ("mpi", "no path of pycoll's takes it")


def _rule(pg: Any, c: Call) -> Optional[Tuple[str, str, Any]]:
    """The built-in rule's path for the call (the first that takes it and can
    carry it), why, and its window; None where none does."""
    for name, takes in rule.ORDER.get(c.func, ()):
        why = takes(c)
        if why is not None:
            ok, win = _ready(pg, c, name)
            if ok:
                return name, why, win
    return None


def candidates(pg: Any, c: Call) -> List[str]:
    """The paths a large call's live trials compare (pycoll.autotune): the
    built-in rule's first (what the others must beat), then MPI's own call,
    then each path the tuning table may name that can carry it (a window is
    made here, on every rank alike)."""
    taken = _rule(pg, c)
    paths = [taken[0] if taken is not None else "mpi", "mpi"]
    for name in tuning.COLLECTIVES[family(c.func)]:
        path = _REGISTRY.get(c.func, {}).get(name)
        if path is None or path.trials is not None and not path.trials(c):
            continue
        if _ready(pg, c, name)[0]:
            paths.append(name)
    return list(dict.fromkeys(paths))


def explain(c: Call, one_node: bool = True) -> str:
    """Which path the call would take on a group of ``c.ranks`` (its ranks
    on one node, or not), with the MPI this process loaded and the tuning
    this environment sets, and why: each decider's answer in turn."""
    lines = [
        f"{c.func}({c.op}, {c.dtype}, {rule.size(c.nbytes)}) on {c.ranks} ranks, "
        f"{_mpi.VENDOR or 'no MPI'}{', one node' if one_node else ', several nodes'}:"
    ]
    table, problem = tuning.read()
    entries = table.get(family(c.func), {}).get(c.ranks) if table else None
    if problem:
        lines.append(f"  tuning table: {problem}")
    if entries is not None and c.nbytes >= entries[0][0]:
        wanted = tuning.path(entries, c.nbytes)
        lines.append(f"  tuning table ({tuning.ENV}): {wanted}")
        taken, why = wanted, "the tuning table"
    else:
        lines.append(f"  tuning table: {'none' if table is None else 'no entry this size'}")
        taken, why = "", ""
    live = tuning.read_live()
    covers = {"pairs": "groups of two", "live": "every group", "off": "no group"}[live]
    if not taken and tuning.LIVE_FROM <= c.nbytes and family(c.func) in tuning.COLLECTIVES:
        decides = live == "live" or (live == "pairs" and c.ranks == 2)
        if decides and tried(c):
            lines.append(f"  live trials (on {covers}): decide, from the first calls")
            taken, why = "trials", "the live trials decide between the paths below"
        else:
            lines.append(f"  live trials: not for this call (they run on {covers})")
    lines.append("  built-in rule (pycoll.paths.rule):")
    for name, takes in rule.ORDER.get(c.func, ()):
        reason = takes(c)
        path = _REGISTRY.get(c.func, {}).get(name)
        if reason is None:
            lines.append(f"    {name}: not at this size")
        elif path is None or not path.carries(c):
            lines.append(f"    {name}: {reason}, but it cannot carry the call")
        elif path.window is not None and not one_node:
            lines.append(f"    {name}: {reason}, but the ranks do not share a node")
        else:
            lines.append(f"    {name}: takes it ({reason})")
            if not taken:
                taken, why = name, reason
    if taken == "trials":
        among = ", ".join(candidates(None, c))
        lines.append(f"  -> the live trials' choice among {among} (each timed in turn first)")
        return "\n".join(lines)
    if not taken:
        taken, why = "mpi", "MPI's own call"
        for path in _REGISTRY.get(c.func, {}).values():
            if path.form and path.carries(c):
                taken, why = path.name, f"MPI's own call, made as {path.summary}"
    lines.append(f"  -> {taken}: {why}")
    return "\n".join(lines)
