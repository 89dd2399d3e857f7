"""Copying many pieces of memory at once: fusion's packing of many arrays
into one buffer and back, and their copies into a shared window and out of
it (pycoll.collectives.shm).

The pieces arrive as a table of (target address, source address, bytes), so
one compiled call copies all of them (in parallel over pieces when the rank
has threads), instead of one Python-level copy per array. Each copy is
LLVM's memcpy.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["copy_kernel", "memcpy"]


@intrinsic
def memcpy(typingctx, target, source, nbytes):
    """memcpy(target, source, nbytes) on raw addresses (int64)."""

    def codegen(context, builder, sig, args):
        byte_ptr = ir.IntType(8).as_pointer()
        dst = builder.inttoptr(args[0], byte_ptr)
        src = builder.inttoptr(args[1], byte_ptr)
        cgutils.raw_memcpy(builder, dst, src, args[2], 1)
        return context.get_dummy_value()

    return types.none(types.int64, types.int64, types.int64), codegen


def _copy(targets, sources, sizes):
    for k in prange(sizes.size):
        memcpy(targets[k], sources[k], sizes[k])


_KERNELS: Dict[Tuple[str, bool], Callable] = {}


def _kernel(template: Callable, parallel: bool) -> Callable:
    key = (template.__name__, parallel)
    kernel = _KERNELS.get(key)
    if kernel is None:
        jit: Any = njit(parallel=parallel, cache=True, nogil=True)
        kernel = _KERNELS[key] = jit(template)
    return kernel


def copy_kernel(parallel: bool) -> Callable:
    """``k(targets, sources, sizes)``: copy ``sizes[k]`` bytes from address
    ``sources[k]`` to address ``targets[k]``, for every k."""
    return _kernel(_copy, parallel)
