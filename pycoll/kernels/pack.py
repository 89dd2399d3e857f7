"""Copying many arrays into one buffer and back (fusion's pack and unpack),
or pieces of them between any two addresses (copy: into a shared window and
out of it, pycoll.collectives.shm).

The arrays arrive as a table of addresses and byte counts, so one compiled
call copies all of them (in parallel over arrays when the rank has threads),
instead of one Python-level copy per array. Each copy is LLVM's memcpy.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["pack_kernel", "unpack_kernel", "copy_kernel"]


@intrinsic
def _memcpy(typingctx, target, source, nbytes):
    """memcpy(target, source, nbytes) on raw addresses (int64)."""

    def codegen(context, builder, sig, args):
        byte_ptr = ir.IntType(8).as_pointer()
        dst = builder.inttoptr(args[0], byte_ptr)
        src = builder.inttoptr(args[1], byte_ptr)
        cgutils.raw_memcpy(builder, dst, src, args[2], 1)
        return context.get_dummy_value()

    return types.none(types.int64, types.int64, types.int64), codegen


def _pack(addresses, sizes, offsets, buffer):
    base = buffer.ctypes.data
    for k in prange(addresses.size):
        _memcpy(base + offsets[k], addresses[k], sizes[k])


def _unpack(buffer, addresses, sizes, offsets):
    base = buffer.ctypes.data
    for k in prange(addresses.size):
        _memcpy(addresses[k], base + offsets[k], sizes[k])


def _copy(targets, sources, sizes):
    for k in prange(sizes.size):
        _memcpy(targets[k], sources[k], sizes[k])


_KERNELS: Dict[Tuple[str, bool], Callable] = {}


def _kernel(template: Callable, parallel: bool) -> Callable:
    key = (template.__name__, parallel)
    kernel = _KERNELS.get(key)
    if kernel is None:
        jit: Any = njit(parallel=parallel, cache=True, nogil=True)
        kernel = _KERNELS[key] = jit(template)
    return kernel


def pack_kernel(parallel: bool) -> Callable:
    """``k(addresses, sizes, offsets, buffer)``: copy each array's bytes to its offset."""
    return _kernel(_pack, parallel)


def unpack_kernel(parallel: bool) -> Callable:
    """``k(buffer, addresses, sizes, offsets)``: copy each slice of the buffer back."""
    return _kernel(_unpack, parallel)


def copy_kernel(parallel: bool) -> Callable:
    """``k(targets, sources, sizes)``: copy ``sizes[k]`` bytes from address
    ``sources[k]`` to address ``targets[k]``, for every k (pieces of arrays
    into a shared window and back: pycoll.collectives.shm)."""
    return _kernel(_copy, parallel)
