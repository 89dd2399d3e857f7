"""The array adapter: which arrays pycoll takes, and how MPI sees them.

Every collective turns its arguments into (array, MPI datatype) pairs here,
and all argument checks on arrays live here, so the messages are the same
whichever collective the mistake was made in. numpy arrays are sent as
they are; CUDA arrays are recognised here
(:func:`on_device`) and handed to pycoll.gpu, which stages them through host
memory or passes them to a CUDA-aware MPI.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, List, Optional, Sequence

import ml_dtypes
import numpy as np

from . import _mpi

__all__ = ["SUPPORTED_DTYPES", "dtype_kind", "mpi_datatype"]

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# dtype -> (kind, name of the MPI datatype that carries it). The kind decides
# which reductions are valid; "half" types travel as 16-bit words and are
# reduced by pycoll, since MPI has no arithmetic for them.
_TABLE: Dict[np.dtype, tuple] = {
    np.dtype(np.bool_): ("bool", "C_BOOL"),
    np.dtype(np.int8): ("int", "INT8_T"),
    np.dtype(np.int16): ("int", "INT16_T"),
    np.dtype(np.int32): ("int", "INT32_T"),
    np.dtype(np.int64): ("int", "INT64_T"),
    np.dtype(np.uint8): ("int", "UINT8_T"),
    np.dtype(np.uint16): ("int", "UINT16_T"),
    np.dtype(np.uint32): ("int", "UINT32_T"),
    np.dtype(np.uint64): ("int", "UINT64_T"),
    np.dtype(np.float16): ("half", "UINT16_T"),
    BFLOAT16: ("half", "UINT16_T"),
    np.dtype(np.float32): ("float", "FLOAT"),
    np.dtype(np.float64): ("float", "DOUBLE"),
    np.dtype(np.complex64): ("complex", "C_FLOAT_COMPLEX"),
    np.dtype(np.complex128): ("complex", "C_DOUBLE_COMPLEX"),
}

SUPPORTED_DTYPES = tuple(_TABLE)
_SUPPORTED_NAMES = ", ".join(str(d) for d in SUPPORTED_DTYPES)

# Filled on first use, after MPI is initialized; the fast paths read it directly.
MPI_TYPES: Dict[np.dtype, Any] = {}


def dtype_kind(dtype: np.dtype) -> str:
    """'bool', 'int', 'half', 'float' or 'complex' for a supported dtype."""
    return _TABLE[dtype][0]


def mpi_datatype(dtype: np.dtype) -> Any:
    """The MPI datatype that carries one element of ``dtype``."""
    try:
        return MPI_TYPES[dtype]
    except KeyError:
        pass
    MPI = _mpi.load()
    for dt, (_, name) in _TABLE.items():
        MPI_TYPES[dt] = getattr(MPI, name)
    return MPI_TYPES[dtype]


# Functions that work on host memory only (their messages do not offer CUDA arrays).
_HOST_ONLY = ("pycoll.kernels", "FusedAllReduce")


def _type_error(func: str, name: str, x: Any) -> TypeError:
    what = "a numpy.ndarray"
    if not func.startswith(_HOST_ONLY):
        what += ", a torch tensor or a CUDA array (cupy, anything with __cuda_array_interface__)"
    return TypeError(f"{func}: {name} must be {what}, got {type(x).__name__}")


# DLPack's device types for CUDA memory (kDLCUDA, kDLCUDAManaged).
CUDA_DLPACK = (2, 13)


def is_cuda(x: Any) -> bool:
    """Whether ``x`` is a CUDA device array: it has ``__cuda_array_interface__``,
    or ``__dlpack__`` with a CUDA ``__dlpack_device__``. Never raises."""
    try:
        if getattr(x, "__cuda_array_interface__", None) is not None:
            return True
    except Exception:  # torch raises here for CPU tensors and some dtypes
        pass
    device = getattr(x, "__dlpack_device__", None)
    if device is None:
        return False
    try:
        return int(device()[0]) in CUDA_DLPACK
    except Exception:
        return False


def on_device(*xs: Any) -> bool:
    """Whether any argument, or any item of a list argument, is a CUDA array.
    numpy arrays and None are skipped first, so host calls pay one type check."""
    for x in xs:
        if type(x) is np.ndarray or x is None:
            continue
        if isinstance(x, (list, tuple)):
            if on_device(*x):
                return True
        elif is_cuda(x):
            return True
    return False


def check_input(func: str, name: str, x: Any) -> np.ndarray:
    """Check an array that is only read; return it C-contiguous.

    A non-contiguous input is copied once so MPI can read it, which is what
    a user would do by hand.
    """
    if not isinstance(x, np.ndarray):
        raise _type_error(func, name, x)
    check_dtype(func, name, x.dtype)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    return x


def check_contiguous(func: str, name: str, x: Any) -> np.ndarray:
    """Check an array that is read where it lies (by a kernel): C-contiguous.

    Unlike :func:`check_input` it does not copy: the caller gave this array
    to be worked on in place, and a copy would quietly leave it untouched.
    """
    if not isinstance(x, np.ndarray):
        raise _type_error(func, name, x)
    check_dtype(func, name, x.dtype)
    if not x.flags.c_contiguous:
        raise ValueError(f"{func}: {name} is not C-contiguous; pass numpy.ascontiguousarray(...)")
    return x


def check_output(func: str, name: str, x: Any) -> np.ndarray:
    """Check an array that MPI writes into: C-contiguous and writeable."""
    if not isinstance(x, np.ndarray):
        raise _type_error(func, name, x)
    check_dtype(func, name, x.dtype)
    flags = x.flags
    if not flags.writeable and 0 in x.strides and x.size > 1:
        raise ValueError(
            f"{func}: {name} is a read-only view that repeats its elements (as "
            f"numpy.broadcast_to makes), so the result cannot be written into it; "
            f"pass a writeable array of its own (e.g. {name}.copy())"
        )
    if not flags.c_contiguous:
        raise ValueError(
            f"{func}: {name} is not C-contiguous, so MPI cannot write the result "
            f"into it; pass numpy.ascontiguousarray(...) and read the result from that"
        )
    if not flags.writeable:
        raise ValueError(
            f"{func}: {name} is read-only, so the result cannot be written into it; "
            f"pass a writeable array (e.g. a copy)"
        )
    return x


def plain_arrays(xs: Any, length: int, dtype: np.dtype, shape: tuple, writeable: bool) -> bool:
    """Whether ``xs`` is a list of ``length`` plain C-contiguous arrays of
    ``dtype`` and ``shape`` (and writeable, if asked): what the checks of a
    list form would pass, in a fraction of their time."""
    if type(xs) is not list or len(xs) != length:
        return False
    for x in xs:
        if not (
            type(x) is np.ndarray
            and x.dtype == dtype
            and x.shape == shape
            and (f := x.flags).c_contiguous
            and (f.writeable or not writeable)
        ):
            return False
    return True


def check_list(func: str, name: str, x: Any, length: Optional[int] = None) -> List[Any]:
    """Check that ``x`` is a list (or tuple) and, if given, of ``length`` items."""
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{func}: {name} must be a list, got {type(x).__name__}")
    if length is not None and len(x) != length:
        raise ValueError(
            f"{func}: {name} must hold one entry per rank of the group: "
            f"expecting {length} items, got {len(x)}"
        )
    return list(x)


def each_labelled(items: Sequence[Any], check: Callable[[Any, str], Any]) -> List[Any]:
    """``check(item, at)`` of every item, ``at`` its index as ``"[i]"``:
    first with ``at`` empty (a label formatted per item costs more than the
    checks of 1,000 arrays), and again with the indices where one fails, so
    its error names the item."""
    try:
        return [check(x, "") for x in items]
    except (TypeError, ValueError):
        for i, x in enumerate(items):
            check(x, f"[{i}]")
        raise


def check_same_dtype(func: str, arrays: Sequence[np.ndarray]) -> np.dtype:
    """Check that all arrays share one dtype and return it."""
    dtype = arrays[0].dtype
    for a in arrays:
        if a.dtype != dtype:
            found = sorted({str(b.dtype) for b in arrays})
            raise ValueError(
                f"{func}: cannot operate on tensors with different dtypes "
                f"(found {', '.join(found)}); convert them to one dtype first"
            )
    return dtype


def check_same_shape(
    func: str, name: str, arrays: Sequence[np.ndarray], shape: tuple, what: str
) -> None:
    """Check that each array has ``shape`` (the shape of ``what``)."""
    for i, a in enumerate(arrays):
        if a.shape != shape:
            raise ValueError(
                f"{func}: {name}[{i}] has shape {a.shape} but must have the shape "
                f"of {what}, {shape}"
            )


def check_size(func: str, name: str, x: np.ndarray, size: int, why: str) -> None:
    """Check that ``x`` holds exactly ``size`` elements."""
    if x.size != size:
        raise ValueError(f"{func}: {name} holds {x.size} elements but must hold {size} ({why})")


def may_alias(input: np.ndarray, output: np.ndarray) -> bool:
    """Whether ``input`` and ``output`` may share memory (cheap when they own it)."""
    if input.base is None and output.base is None and input is not output:
        return False  # two arrays that each own their data never overlap
    return bool(input.size) and np.may_share_memory(input, output)


def apart(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays surely share no memory: each owning its own, or
    their byte ranges disjoint (arrays over memory numpy does not own, as
    pycoll.torchcompat's views of tensors, pay for the bounds)."""
    if a.base is None and b.base is None:
        return a is not b
    return not np.may_share_memory(a, b)


def detach(input: np.ndarray, output: np.ndarray) -> np.ndarray:
    """``input``, or a copy of it when it shares memory with ``output``.

    MPI forbids a send buffer that overlaps the receive buffer; torch-style
    in-place calls (input a slice of output) get a private copy instead.
    """
    return input.copy() if may_alias(input, output) else input


def own_part(part: np.ndarray, whole: np.ndarray, index: int) -> bool:
    """:func:`is_slot` for arrays already checked (contiguous, of one dtype,
    ``part`` a view into ``whole``), by MPI's cheap address of a buffer
    (numpy's ``__array_interface__`` costs over a microsecond)."""
    address = _mpi.MPI.buffer
    return (
        part.flags.c_contiguous
        and address(part).address == address(whole).address + index * part.nbytes
    )


def is_slot(input: np.ndarray, output: np.ndarray, index: int) -> bool:
    """True when ``input`` is exactly the ``index``-th of equal parts of ``output``."""
    if not may_alias(input, output) or input.dtype != output.dtype:
        return False
    start = output.__array_interface__["data"][0] + index * input.nbytes
    return input.__array_interface__["data"][0] == start and input.flags.c_contiguous


def check_dtype(func: str, name: str, dtype: np.dtype) -> None:
    """Raise the adapter's ValueError for a dtype pycoll cannot send."""
    if dtype not in _TABLE:
        raise ValueError(
            f"{func}: {name} has dtype {dtype}, which pycoll cannot send; "
            f"supported dtypes are {_SUPPORTED_NAMES}"
        )


def same_objects(arrays: Any, others: Any) -> bool:
    """The same array objects in the same order (a list given again: a
    training step's gradients)."""
    return len(arrays) == len(others) and all(map(operator.is_, arrays, others))
