"""Functional collectives: new arrays out, inputs never written, results in flight.

Each function here has the name, arguments and meaning of its namesake in
``torch.distributed._functional_collectives``, for numpy arrays and CUDA
arrays (cupy, or anything with ``__array_namespace__`` and a CUDA interface)::

    from pycoll import functional as F

    y = F.all_reduce(x, "sum", group)     # returns at once; x is untouched
    z = expensive(w)                      # overlaps the communication
    print((y + z).sum())                  # the first read waits for y's data

The call starts the collective and returns an :class:`AsyncArray`: a stand-in
that knows its shape and dtype at once and waits for its data the first time
anything reads it: any numpy function or ufunc, an operator, indexing, a
method, ``np.asarray``, iteration, pickling, pycoll's own
collectives, mpi4py (through ``__dlpack__``) and, on Python 3.12 and later,
the buffer protocol (``memoryview``, C extensions). On Python 3.11 and
earlier a class written in Python cannot offer the buffer protocol, so code
that takes raw buffers (``memoryview(y)``, ``bytes(y)``, some C extensions)
gets a TypeError instead of unfinished memory; :func:`wait_tensor` gives the
plain array and is the safe way to hand a result to such code.

Rules, as for any nonblocking operation:

- The input is read while the operation is in flight (all but all_reduce,
  broadcast and reduce_scatter along a dimension other than 0, which take a
  copy at the call): do not write into it until the result has been read.
- A result that is never read is still completed: when the stand-in is
  dropped it waits for its operation (within the group's timeout), so the
  buffers MPI writes into stay alive and the peers are never left waiting.
- The call is collective, exactly as the imperative one: every rank of the
  group calls the same functions in the same order; its sequence number,
  call check and timeout are the group's.

``group`` is a pycoll ProcessGroup (None: the default group), the torch
ProcessGroup of the "pycoll" backend, a list of global ranks, or a list of
such lists (a 2-D mesh: each rank uses the list holding it). A list is made
into a group once, by the listed ranks only (``new_group(...,
use_local_synchronization=True)``), kept with the default group and freed
with it. ``reduceOp`` is a :class:`pycoll.ReduceOp` (PREMUL_SUM included),
torch's ReduceOp, or torch's names: ``"sum"``, ``"avg"``, ``"product"``,
``"min"``, ``"max"``, ``"band"``, ``"bor"``, ``"bxor"``.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from . import groups, torchcompat
from .arrays import check_input, each_labelled
from .collectives import coalesced
from .collectives.alltoall import all_to_all_single as _all_to_all_single
from .collectives.gather import all_gather_into_tensor as _all_gather_into_tensor
from .collectives.reduce import all_reduce as _all_reduce
from .collectives.reduce import reduce_scatter_tensor as _reduce_scatter_tensor
from .collectives.scatter import broadcast as _broadcast
from .reduceop import ReduceOp
from .subgroups import new_group

__all__ = [
    "AsyncArray",
    "all_gather_into_tensor_coalesced",
    "all_gather_tensor",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all_single",
    "broadcast",
    "permute_tensor",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "wait_tensor",
]

_FINISH = threading.Lock()  # one finisher per result; held only to run `finish`
_ABANDONED: List[Any] = []  # buffers of operations on groups that timed out


class _Pending:
    """The operations behind one or more results (a coalesced call's results
    share one), waited for once: at the first read of any of them, or when
    the last of them is dropped unread, so the buffers MPI writes into
    (``keep``) outlive the operations and staged operations reach the peers.
    Its error is raised again on every later read."""

    __slots__ = ("works", "group", "keep", "failed")

    def __init__(self, works: Sequence[Any], group: Any, keep: Any) -> None:
        self.works: Optional[Sequence[Any]] = works
        self.group = group
        self.keep = keep
        self.failed: Optional[BaseException] = None

    def wait(self) -> None:
        works = self.works
        if works is None:
            return
        if self.failed is not None:
            raise self.failed
        try:
            for work in works:
                work.wait()  # thread-safe; raises the operation's error
        except BaseException as exc:
            self.failed = exc  # raised again on every read, without waiting again
            raise
        self.works = None

    def done(self) -> bool:
        works = self.works
        return works is None or all(w.is_completed() for w in works)

    def __del__(self) -> None:
        try:
            works = self.works
        except AttributeError:  # __init__ did not get that far
            return
        if works is None or sys.is_finalizing():
            return
        if self.failed is not None or self.group.is_broken():
            # A timed-out operation never completes and MPI may still write
            # into its buffers: keep them for good rather than wait again.
            _ABANDONED.append((works, self.keep))
            return
        for work in works:
            work.wait()


class AsyncArray(NDArrayOperatorsMixin):
    """The result of a functional collective, waited for on first read.

    ``shape``, ``dtype``, ``ndim``, ``size``, ``nbytes`` and ``len()`` are
    known without waiting; everything else waits for the data first and then
    acts on the plain array (numpy's or the device library's), returning
    plain arrays. :meth:`wait` (or :func:`wait_tensor`) returns the plain
    array itself.
    """

    __slots__ = ("_pending", "_value", "_finish", "shape", "dtype", "__weakref__")

    def __init__(
        self,
        works: Sequence[Any],
        value: Any,
        shape: Tuple[int, ...],
        group: Any,
        finish: Optional[Callable[[Any], Any]] = None,
        pending: Optional[_Pending] = None,
    ) -> None:
        if pending is None and works:
            pending = _Pending(works, group, value)
        self._pending = pending
        self._value = value
        self._finish = finish
        self.shape = shape if type(shape) is tuple else tuple(shape)
        self.dtype = value.dtype
        if pending is None and finish is not None:
            self._value, self._finish = finish(value), None

    # -- waiting ---------------------------------------------------------------
    def wait(self) -> Any:
        """Wait for the operation (within its group's timeout) and return the
        plain array. Raises the operation's error, on every call."""
        pending = self._pending
        if pending is not None:
            pending.wait()
            with _FINISH:
                if self._pending is not None:
                    if self._finish is not None:
                        self._value = self._finish(self._value)
                        self._finish = None
                    self._pending = None
        return self._value

    def done(self) -> bool:
        """Whether the data is there (a read would not wait). Never blocks."""
        pending = self._pending
        return pending is None or pending.done()

    # -- metadata, known at once ---------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    # -- every read waits ----------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name in AsyncArray.__slots__:  # not yet set (during __init__ or unpickling)
            raise AttributeError(name)
        return getattr(self.wait(), name)

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        value = self.wait()
        if copy:
            return np.array(value, dtype=dtype, copy=True)
        return np.asarray(value, dtype=dtype)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        inputs = _plain(inputs)
        if "out" in kwargs:
            kwargs["out"] = _plain(kwargs["out"])
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return func(*_plain(args), **_plain(kwargs))

    def __buffer__(self, flags: int) -> memoryview:  # Python 3.12+: PEP 688
        return memoryview(self.wait())

    def __getitem__(self, key: Any) -> Any:
        return self.wait()[_plain(key)]

    def __setitem__(self, key: Any, value: Any) -> None:
        self.wait()[_plain(key)] = _plain(value)

    def __iter__(self) -> Any:
        return iter(self.wait())

    def __bool__(self) -> bool:
        return bool(self.wait())

    def __float__(self) -> float:
        return float(self.wait())

    def __int__(self) -> int:
        return int(self.wait())

    def __complex__(self) -> complex:
        return complex(self.wait())

    def __index__(self) -> int:
        return self.wait().__index__()

    def __repr__(self) -> str:
        return f"AsyncArray({self.wait()!r})"

    def __str__(self) -> str:
        return str(self.wait())

    def __reduce__(self) -> Any:
        return (_identity, (self.wait(),))

    def __copy__(self) -> Any:
        return self.wait().copy()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        return self.wait().copy()


def _identity(x: Any) -> Any:
    return x


def _plain(x: Any) -> Any:
    """``x`` with every AsyncArray in it (at any depth of tuples, lists and
    dicts) replaced by its waited value."""
    if isinstance(x, AsyncArray):
        return x.wait()
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def wait_tensor(tensor: Any) -> Any:
    """Wait for a functional collective's result and return the plain array
    (numpy's or the device library's); any other array is returned as is."""
    if isinstance(tensor, AsyncArray):
        return tensor.wait()
    return tensor


# -- arrays: numpy, cupy, array-API namespaces --------------------------------------


class _Host:
    """How the functions allocate, copy and join numpy arrays."""

    @staticmethod
    def empty(like: Any, shape: Tuple[int, ...]) -> Any:
        return np.empty(shape, like.dtype)

    @staticmethod
    def copy(x: Any) -> Any:
        return x.copy(order="C")

    @staticmethod
    def contiguous(x: Any) -> Any:
        return np.ascontiguousarray(x)

    @staticmethod
    def concat(parts: List[Any], axis: int) -> Any:
        return np.concatenate(parts, axis=axis)


class _Device:
    """The same for a device array, through its library's namespace: cupy's
    numpy-like module, or the array API's ``__array_namespace__()``."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp
        self._concat = getattr(xp, "concat", None) or xp.concatenate

    def empty(self, like: Any, shape: Tuple[int, ...]) -> Any:
        return self.xp.empty(shape, dtype=like.dtype)

    def copy(self, x: Any) -> Any:
        return x.copy()

    def contiguous(self, x: Any) -> Any:
        return x  # the device door checks contiguity and says how to fix it

    def concat(self, parts: List[Any], axis: int) -> Any:
        return self._concat(parts, axis=axis)


_HOST = _Host()


def _arrays(func: str, x: Any, name: str = "self") -> Tuple[Any, Any]:
    """How to handle ``x`` and ``x`` itself (a pending result waited for: a
    functional collective's result may feed the next), or the TypeError
    saying what is accepted."""
    if type(x) is np.ndarray:
        return _HOST, x
    if isinstance(x, AsyncArray):
        x = x.wait()
    if isinstance(x, np.ndarray):
        return _HOST, x
    if torchcompat.imported() and type(x).__module__.startswith("torch"):
        raise TypeError(
            f"{func}: {name} is a torch tensor; for tensors use torch's own functional "
            f"collectives (torch.distributed._functional_collectives) on a group of the "
            f"'pycoll' backend, or pass {name}.numpy()"
        )
    root = type(x).__module__.split(".")[0]
    if root == "cupy":
        return _Device(sys.modules["cupy"]), x
    space = getattr(x, "__array_namespace__", None)
    if space is not None and (
        hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack_device__")
    ):
        return _Device(space()), x
    raise TypeError(
        f"{func}: {name} must be a numpy array or a CUDA array (cupy, or one with "
        f"__array_namespace__), got {type(x).__name__}"
        + ("; wrap a scalar with np.asarray(...)" if np.isscalar(x) else "")
    )


def _at_least_1d(func: str, x: Any, name: str = "self") -> None:
    if len(x.shape) == 0:
        raise ValueError(
            f"{func}: {name} is a 0-d array; it needs a dimension to "
            f"{'gather' if 'gather' in func else 'split'} along (reshape it to (1,))"
        )


def _dim(func: str, name: str, dim: Any, ndim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{func}: {name} must be an int, got {type(dim).__name__}")
    if not -ndim <= dim < ndim:
        raise ValueError(
            f"{func}: {name}={dim} is out of range for an array of {ndim} dimension(s) "
            f"(valid: {-ndim} to {ndim - 1})"
        )
    return int(dim) % ndim


def _chunks(x: Any, n: int, axis: int) -> List[Any]:
    """``x`` split along ``axis`` into ``n`` equal views."""
    step = x.shape[axis] // n
    head = (slice(None),) * axis
    return [x[head + (slice(i * step, (i + 1) * step),)] for i in range(n)]


# -- groups and ops -----------------------------------------------------------------


def _group(func: str, group: Any) -> Any:
    """The pycoll ProcessGroup to run on (see the module docstring)."""
    if group is None or isinstance(group, groups.ProcessGroup):
        pg = groups.resolve(group, func)
        if pg is None:
            raise ValueError(
                f"{func}: rank {groups.get_rank()} is not a member of this group; "
                f"a functional collective runs only on the group's members"
            )
        return pg
    inner = getattr(group, "pycoll_group", None)  # pycoll.torch's ProcessGroupPycoll
    if inner is not None:
        return _group(func, inner)
    if isinstance(group, (list, tuple)):
        return _by_ranks(func, list(group))
    raise TypeError(
        f"{func}: group must be a pycoll ProcessGroup, a torch group of the 'pycoll' "
        f"backend, a list of ranks or a list of such lists, got {type(group).__name__}"
    )


def _by_ranks(func: str, ranks: List[Any]) -> Any:
    world = _group(func, None)
    me = world.rank()
    if ranks and all(isinstance(r, (list, tuple)) for r in ranks):
        sizes = {len(r) for r in ranks}
        if len(sizes) != 1:
            raise ValueError(f"{func}: the rank lists of a mesh must have one size, got {ranks}")
        mine = [list(r) for r in ranks if me in r]
        if len(mine) != 1:
            raise ValueError(
                f"{func}: rank {me} must be in exactly one list of the mesh {ranks}, "
                f"found in {len(mine)}"
            )
        ranks = mine[0]
    if not ranks or not all(
        isinstance(r, (int, np.integer)) and not isinstance(r, bool) for r in ranks
    ):
        raise TypeError(
            f"{func}: group as a list must hold global ranks (ints) or lists of them, got {ranks}"
        )
    key = tuple(sorted(int(r) for r in ranks))
    if len(set(key)) != len(key) or not 0 <= key[0] <= key[-1] < world.size():
        raise ValueError(
            f"{func}: group {ranks} must list distinct ranks between 0 and {world.size() - 1}"
        )
    if me not in key:
        raise ValueError(
            f"{func}: rank {me} is not in group {ranks}; only the listed ranks may call"
        )
    if len(key) == world.size():
        return world
    # The groups made from rank lists, kept with the default group: they go
    # when it is destroyed (destroy_process_group frees every group).
    made = world.attached("functional.groups")
    if made is None:
        made = world.attach("functional.groups", {})
    pg = made.get(key)
    if pg is None:
        pg = made[key] = new_group(list(key), use_local_synchronization=True)
    return pg


_OP_NAMES = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")
_BY_NAME = {name: ReduceOp(name) for name in _OP_NAMES}


def _op(func: str, op: Any) -> ReduceOp:
    if type(op) is str:
        mine = _BY_NAME.get(op)
        if mine is not None:
            return mine
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        mine = _BY_NAME.get(op.lower())
        if mine is not None:
            return mine
        raise ValueError(
            f"{func}: unknown reduceOp {op!r}; use one of {', '.join(map(repr, _OP_NAMES))}, "
            f"a pycoll.ReduceOp, or make_premul_sum(factor)"
        )
    mine = torchcompat.reduce_op(op, func)
    if isinstance(mine, ReduceOp):
        return mine
    raise TypeError(f"{func}: reduceOp must be a string or a ReduceOp, got {type(op).__name__}")


# -- the collectives ------------------------------------------------------------------


def all_reduce(self: Any, reduceOp: Any, group: Any = None, tag: str = "") -> AsyncArray:
    """The reduction of ``self`` over the group, as a new array (``self``
    unchanged). ``tag`` is accepted for torch's signature and ignored."""
    func = "all_reduce"
    xs, self = _arrays(func, self)
    op = _op(func, reduceOp)
    pg = _group(func, group)
    out = xs.copy(self)
    work = _all_reduce(out, op=op, group=pg, async_op=True)
    return AsyncArray([work], out, out.shape, pg)


def broadcast(self: Any, src: int, group: Any = None, tag: str = "") -> AsyncArray:
    """Group rank ``src``'s ``self`` on every rank, as a new array.

    ``src`` is a rank within the group, as in torch's functional broadcast
    (the imperative ``pycoll.broadcast`` takes a global rank)."""
    func = "broadcast"
    xs, self = _arrays(func, self)
    pg = _group(func, group)
    n = pg.size()
    if isinstance(src, bool) or not isinstance(src, (int, np.integer)) or not 0 <= src < n:
        raise ValueError(f"{func}: src={src!r} must be a group rank between 0 and {n - 1}")
    out = xs.copy(self) if pg.rank() == src else xs.empty(self, tuple(self.shape))
    work = _broadcast(out, src=groups.get_global_rank(pg, int(src)), group=pg, async_op=True)
    return AsyncArray([work], out, out.shape, pg)


def all_gather_tensor(self: Any, gather_dim: int, group: Any = None, tag: str = "") -> AsyncArray:
    """Every rank's ``self`` joined along ``gather_dim`` in group-rank order."""
    func = "all_gather_tensor"
    xs, self = _arrays(func, self)
    _at_least_1d(func, self)
    dim = _dim(func, "gather_dim", gather_dim, len(self.shape))
    pg = _group(func, group)
    n = pg.size()
    x = xs.contiguous(self)
    shape = tuple(x.shape)
    out = xs.empty(x, (n * shape[0],) + shape[1:])
    work = _all_gather_into_tensor(out, x, group=pg, async_op=True)
    if dim == 0:
        return AsyncArray([work], out, out.shape, pg)
    final = shape[:dim] + (n * shape[dim],) + shape[dim + 1 :]
    return AsyncArray(
        [work], out, final, pg, lambda stacked: xs.concat(_chunks(stacked, n, 0), axis=dim)
    )


def reduce_scatter_tensor(
    self: Any, reduceOp: Any, scatter_dim: int, group: Any = None, tag: str = ""
) -> AsyncArray:
    """``self`` reduced over the group and split along ``scatter_dim`` into
    one equal block per rank; this rank's block, as a new array."""
    func = "reduce_scatter_tensor"
    xs, self = _arrays(func, self)
    _at_least_1d(func, self)
    dim = _dim(func, "scatter_dim", scatter_dim, len(self.shape))
    op = _op(func, reduceOp)
    pg = _group(func, group)
    n = pg.size()
    _divisible(func, self, dim, "self", n)
    shape = tuple(self.shape)
    block = shape[:dim] + (shape[dim] // n,) + shape[dim + 1 :]
    x = xs.contiguous(self) if dim == 0 else xs.concat(_chunks(self, n, dim), axis=0)
    out = xs.empty(x, block)
    work = _reduce_scatter_tensor(out, x, op=op, group=pg, async_op=True)
    return AsyncArray([work], out, block, pg)


def _divisible(func: str, x: Any, dim: int, label: str, n: int) -> None:
    """Dimension ``dim`` of ``x`` must split into ``n`` equal blocks."""
    if x.shape[dim] % n:
        raise ValueError(
            f"{func}: dimension {dim} of {label} has size {x.shape[dim]}, not divisible by "
            f"the group's {n} ranks"
        )


def _split_sizes(func: str, name: str, sizes: Any, n: int) -> List[int]:
    sizes = list(sizes)
    if len(sizes) != n or not all(
        isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in sizes
    ):
        raise ValueError(
            f"{func}: {name} must be {n} non-negative ints (one per rank), got {sizes}"
        )
    return [int(s) for s in sizes]


def all_to_all_single(
    self: Any,
    output_split_sizes: Optional[Sequence[int]],
    input_split_sizes: Optional[Sequence[int]],
    group: Any = None,
    tag: str = "",
) -> AsyncArray:
    """Rows of ``self`` sent to each rank (``input_split_sizes[r]`` rows to
    rank r, in order), the rows received joined in group-rank order.

    Both split lists are given, or both are None (equal splits of dim 0)."""
    func = "all_to_all_single"
    xs, self = _arrays(func, self)
    _at_least_1d(func, self)
    pg = _group(func, group)
    n = pg.size()
    rows = self.shape[0]
    if (output_split_sizes is None) != (input_split_sizes is None):
        raise ValueError(
            f"{func}: output_split_sizes and input_split_sizes must be given together "
            f"or both be None (equal splits)"
        )
    if output_split_sizes is None or input_split_sizes is None:
        if rows % n:
            raise ValueError(
                f"{func}: dimension 0 of self has size {rows}, not divisible by the "
                f"group's {n} ranks; pass output_split_sizes and input_split_sizes"
            )
        outs = ins = [rows // n] * n
    else:
        outs = _split_sizes(func, "output_split_sizes", output_split_sizes, n)
        ins = _split_sizes(func, "input_split_sizes", input_split_sizes, n)
        if sum(ins) != rows:
            raise ValueError(
                f"{func}: input_split_sizes {ins} add up to {sum(ins)} rows but self has {rows}"
            )
    x = xs.contiguous(self)
    out = xs.empty(x, (sum(outs),) + tuple(self.shape[1:]))
    work = _all_to_all_single(out, x, outs, ins, group=pg, async_op=True)
    return AsyncArray([work], out, out.shape, pg)


def permute_tensor(
    self: Any, src_dst: Sequence[int], group: Any = None, tag: str = ""
) -> AsyncArray:
    """``self`` sent along a permutation of the group: ``src_dst[m] == k``
    means group rank m sends to group rank k; each rank returns what it
    received (shape and dtype as ``self``, the same on every rank)."""
    func = "permute_tensor"
    _, self = _arrays(func, self)
    _at_least_1d(func, self)
    pg = _group(func, group)
    n = pg.size()
    perm = list(src_dst)
    if sorted(perm) != list(range(n)):
        raise ValueError(
            f"{func}: src_dst must be a permutation of the group ranks 0..{n - 1}, got {perm}"
        )
    me = pg.rank()
    dst, src = perm[me], perm.index(me)
    rows = self.shape[0]
    ins = [rows if k == dst else 0 for k in range(n)]
    outs = [rows if m == src else 0 for m in range(n)]
    return all_to_all_single(self, outs, ins, pg)


def all_reduce_coalesced(
    self: List[Any], reduceOp: Any, group: Any = None, tag: str = ""
) -> List[AsyncArray]:
    """:func:`all_reduce` of several arrays of one dtype in one MPI operation:
    they are packed into one new buffer and the results are views of it."""
    func = "all_reduce_coalesced"
    found = each_labelled(_list(func, self), lambda x, at: _arrays(func, x, f"self{at}"))
    xs = found[0][0]
    arrays = [x for _, x in found]
    dtype = arrays[0].dtype
    for i, x in enumerate(arrays):
        if x.dtype != dtype:
            raise ValueError(
                f"{func}: self[{i}] has dtype {x.dtype} but self[0] has {dtype}; "
                f"the arrays must share one dtype"
            )
    op = _op(func, reduceOp)
    pg = _group(func, group)
    flat = xs.concat([x.reshape(-1) for x in arrays], axis=0)
    work = _all_reduce(flat, op=op, group=pg, async_op=True)
    shapes = [tuple(x.shape) for x in arrays]
    return _results([work], flat, pg, [flat[a:b].reshape(s) for a, b, s in _spans(shapes)])


def all_gather_into_tensor_coalesced(
    self: List[Any], group: Any = None, tag: str = ""
) -> List[AsyncArray]:
    """:func:`all_gather_tensor` along dimension 0 of several arrays. numpy
    arrays (of any dtypes) go in one MPI operation
    (pycoll.collectives.coalesced); device arrays one operation each."""
    func = "all_gather_into_tensor_coalesced"
    found = each_labelled(_list(func, self), lambda x, at: _arrays(func, x, f"self{at}"))
    arrays = [x for _, x in found]
    each_labelled(arrays, lambda x, at: _at_least_1d(func, x, f"self{at}"))
    pg = _group(func, group)
    if any(xs is not _HOST for xs, _ in found):
        return [all_gather_tensor(x, 0, pg) for x in arrays]
    n = pg.size()
    ins = each_labelled(arrays, lambda x, at: check_input(func, f"self{at}", x))
    sizes = np.array([x.nbytes for x in ins], np.int64)
    out = np.empty(n * int(sizes.sum()), np.uint8)
    starts = n * np.cumsum(sizes) - n * sizes  # output i's first byte in out
    targets = coalesced.addresses([out]) + starts + np.arange(n, dtype=np.int64)[:, None] * sizes
    shapes = [(n * x.shape[0],) + tuple(x.shape[1:]) for x in ins]
    work = coalesced.all_gather_bytes(
        pg, func, ins, targets, None, True, lambda: f"{func}(inputs={coalesced.signature(ins)})"
    )
    views = [
        np.ndarray(shape, x.dtype, out, int(start)) for shape, x, start in zip(shapes, ins, starts)
    ]
    return _results([work], out, pg, views)


def reduce_scatter_tensor_coalesced(
    inputs: List[Any],
    reduceOp: Any,
    scatter_dim: Sequence[int],
    group: Any = None,
    tag: str = "",
) -> List[AsyncArray]:
    """:func:`reduce_scatter_tensor` of several arrays, ``scatter_dim[i]``
    for ``inputs[i]``. numpy arrays of one dtype, all split along dimension
    0, go in one MPI operation (pycoll.collectives.coalesced), the results
    views of one buffer; otherwise one operation each."""
    func = "reduce_scatter_tensor_coalesced"
    given = _list(func, inputs, "inputs")
    dims = list(scatter_dim)
    if len(dims) != len(given):
        raise ValueError(
            f"{func}: scatter_dim has {len(dims)} entries for {len(given)} inputs; "
            f"give one dimension per input"
        )
    op = _op(func, reduceOp)
    pg = _group(func, group)
    n = pg.size()
    found = each_labelled(given, lambda x, at: _arrays(func, x, f"inputs{at}"))
    arrays = [x for _, x in found]

    def dim_of(pair: Tuple[Any, Any], at: str) -> int:
        x, d = pair
        _at_least_1d(func, x, f"inputs{at}")
        d = _dim(func, f"scatter_dim{at}", d, len(x.shape))
        _divisible(func, x, d, f"inputs{at}", n)
        return d

    dims = each_labelled(list(zip(arrays, dims)), dim_of)  # every check before anything starts
    dtype = arrays[0].dtype
    if any(d or xs is not _HOST or x.dtype != dtype for (xs, x), d in zip(found, dims)):
        return [reduce_scatter_tensor(x, op, d, pg) for x, d in zip(arrays, dims)]
    ins = each_labelled(arrays, lambda x, at: check_input(func, f"inputs{at}", x))
    work, recv = coalesced.reduce_scatter_parts(
        pg,
        func,
        ins,
        None,
        dtype,
        op,
        True,
        lambda: f"{func}({op.name}, inputs={coalesced.signature(ins)})",
    )
    assert recv is not None  # (no outputs: the results are views of it)
    shapes = [(x.shape[0] // n,) + tuple(x.shape[1:]) for x in ins]
    return _results([work], recv, pg, [recv[a:b].reshape(s) for a, b, s in _spans(shapes)])


def _results(works: List[Any], keep: Any, pg: Any, views: List[Any]) -> List[AsyncArray]:
    """One result per view (of ``keep``, the buffer the operations write),
    all waiting on the same operations: the first read waits for them, and
    they are waited for once the last result is dropped unread."""
    pending = _Pending(works, pg, keep)
    return [AsyncArray(works, v, v.shape, pg, None, pending) for v in views]


def _list(func: str, arrays: Any, name: str = "self") -> List[Any]:
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{func}: {name} must be a list of arrays, got {type(arrays).__name__}")
    if not arrays:
        raise ValueError(f"{func}: {name} is empty; pass at least one array")
    return list(arrays)


def _spans(shapes: List[Tuple[int, ...]]) -> List[Tuple[int, int, Tuple[int, ...]]]:
    """(start, end, shape) of arrays of ``shapes`` back to back in a flat buffer."""
    spans, at = [], 0
    for shape in shapes:
        end = at + math.prod(shape)
        spans.append((at, end, shape))
        at = end
    return spans
