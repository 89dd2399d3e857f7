"""torch tensors for the tests that need torch (imported only once torch is
known to be installed): numpy's dtypes as torch's, and tensors made from
numpy values and read back."""

from __future__ import annotations

import numpy as np
import torch

from support import BF16

# numpy dtype -> torch dtype, for every dtype both have
TORCH = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.float16): torch.float16,
    BF16: torch.bfloat16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.complex64): torch.complex64,
    np.dtype(np.complex128): torch.complex128,
}


def tensor(x: np.ndarray) -> torch.Tensor:
    """A torch tensor holding ``x`` (built from its values, not from its memory)."""
    if x.dtype == BF16:
        return torch.tensor(x.astype(np.float32).tolist(), dtype=torch.bfloat16)
    return torch.tensor(x.tolist(), dtype=TORCH[x.dtype])


def values(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as numpy, in the dtype the tests compare in."""
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(BF16)
    return t.numpy()
