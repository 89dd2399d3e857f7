"""pycoll's kernels as MPI user-defined operations.

MPI_Op_create wants a C function ``void f(void *in, void *inout, int *len,
MPI_Datatype *type)``. mpi4py's ``Op.Create`` only wraps Python callables
(one Python call per chunk, holding the GIL), so pycoll compiles the kernel
as a numba ``cfunc`` and registers its address by calling MPI_Op_create in
the very libmpi that mpi4py loaded, through ctypes; mpi4py's
``Op.fromhandle`` then wraps the handle. The handle's C type is the one
vendor difference: an ``int`` in MPICH (and its derivatives), a pointer in
Open MPI; mpi4py reports its size. MPI then runs its own algorithms and calls
compiled code on each chunk it reduces.
"""

from __future__ import annotations

import ctypes
import types as pytypes
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
from numba import carray, cfunc
from numba import types as nbtypes

from .. import _mpi
from .elementwise import _SALT, mean_of_two_kernel, reduce_kernel, storage_tag

__all__ = ["user_op", "free_all", "created"]

# void (*)(void *invec, void *inoutvec, int *len, MPI_Datatype *datatype)
SIGNATURE = nbtypes.void(
    nbtypes.voidptr, nbtypes.voidptr, nbtypes.CPointer(nbtypes.int32), nbtypes.voidptr
)

kernel: Any = None  # bound per variant (see _build)
ELEMENT: Any = np.uint8


def _user_function(invec, inoutvec, length, datatype):
    n = length[0]
    kernel(carray(invec, (n,), ELEMENT), carray(inoutvec, (n,), ELEMENT))


_ops: Dict[Tuple[str, np.dtype, bool], Any] = {}
_functions: Dict[Tuple[str, np.dtype, bool], Any] = {}
_create: Optional[Callable[..., int]] = None


def _op_create() -> Callable[[int], int]:
    global _create
    if _create is None:
        MPI = _mpi.load()
        lib = _mpi.library()
        fn = lib.MPI_Op_create
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        # MPI_Op is an int in MPICH (read unsigned: mpi4py takes it as one),
        # a pointer in Open MPI.
        small = MPI._sizeof(MPI.Op) == ctypes.sizeof(ctypes.c_uint)
        handle_type = ctypes.c_uint if small else ctypes.c_void_p

        def create(address: int) -> int:
            handle = handle_type()
            rc = fn(ctypes.c_void_p(address), 1, ctypes.byref(handle))
            if rc != 0:
                raise RuntimeError(f"MPI_Op_create failed with error code {rc}")
            return int(handle.value or 0)

        _create = create
    return _create


def _build(op: str, dtype: np.dtype, storage: str, f16c: bool) -> Any:
    """The compiled C callback for (op, dtype)."""
    key = (op, dtype, f16c)
    compiled = _functions.get(key)
    if compiled is None:
        scope = dict(_user_function.__globals__)
        if op == "MEAN2":
            scope["kernel"] = mean_of_two_kernel(storage, f16c, parallel=False)
        else:
            scope["kernel"] = reduce_kernel(op, storage, f16c, parallel=False)
        scope["ELEMENT"] = np.uint16 if storage in ("float16", "bfloat16") else dtype.type
        fn = pytypes.FunctionType(_user_function.__code__, scope, "_user_function")
        # One cfunc per dtype (its element type is compiled in), so the name
        # carries the dtype itself: numba keys its disk cache on it.
        fn.__qualname__ = f"mpi_{op}_{storage_tag(storage, f16c)}_{_SALT}"
        compiled = _functions[key] = cfunc(SIGNATURE, cache=True)(fn)
    return compiled


def user_op(op: str, dtype: np.dtype, storage: str, f16c: bool) -> Any:
    """The MPI op (an ``mpi4py.MPI.Op``, commutative) reducing ``dtype`` with
    ``op``; created on first use and kept until :func:`free_all`."""
    key = (op, dtype, f16c)
    mpi_op = _ops.get(key)
    if mpi_op is None:
        compiled = _build(op, dtype, storage, f16c)
        handle = _op_create()(compiled.address)
        mpi_op = _ops[key] = _mpi.load().Op.fromhandle(handle)
    return mpi_op


def created() -> int:
    """How many MPI ops this module has registered and not freed."""
    return len(_ops)


def free_all() -> None:
    """MPI_Op_free every op created here (before MPI_Finalize)."""
    for mpi_op in _ops.values():
        mpi_op.Free()
    _ops.clear()
