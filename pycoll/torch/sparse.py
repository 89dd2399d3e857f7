"""all_reduce of sparse COO tensors through the backend "pycoll", as gloo does.

MPI has no sparse reduction, and a sparse tensor has no memory numpy can view.
gloo's answer, and this one: every rank gathers every rank's indices and
values, concatenates them and coalesces (duplicate indices summed), so each
rank ends with the same sparse sum. DDP takes this path for sparse gradients
(``nn.Embedding(sparse=True)``).

The exchange is three all-gathers on the group: a fixed-size header (the
number of non-zeros and a digest of the shape and dtype, which every rank
must agree on), then the indices and the values, each padded to the largest
number of non-zeros. It runs synchronously, also under ``async_op=True``:
its second and third steps need the first's sizes.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import torch

import pycoll

from ..torchcompat import host_view

__all__ = ["all_reduce"]


def _digest(t: torch.Tensor) -> int:
    """What every rank's tensor must agree on: shape, sparse dimensions, dtype."""
    text = f"{tuple(t.shape)} {t.sparse_dim()} {t.dtype}"
    return zlib.crc32(text.encode())


def all_reduce(tensor: torch.Tensor, op: Any, group: Any) -> None:
    """Sum the sparse COO ``tensor`` over the pycoll group ``group``, in place.

    Raises:
        ValueError: ``op`` is not SUM (the only reduction sparse tensors have
            here, as in gloo), or the ranks' tensors differ in shape, sparse
            dimensions or dtype (on every rank: each sees every header).
    """
    if op != pycoll.ReduceOp.SUM:
        raise ValueError(
            f"all_reduce: a sparse tensor can be reduced with ReduceOp.SUM only (as in gloo), "
            f"not {op}; use a dense tensor (tensor.to_dense()) for other reductions"
        )
    local = tensor.detach().coalesce().cpu()
    indices, values = local.indices(), local.values()
    nnz = indices.shape[1]
    size = group.size()
    headers = np.zeros((size, 2), np.int64)
    pycoll.all_gather_into_tensor(headers, np.array([nnz, _digest(tensor)], np.int64), group=group)
    if len(set(headers[:, 1].tolist())) != 1:
        raise ValueError(
            f"all_reduce: the ranks' sparse tensors differ in shape, sparse dimensions or "
            f"dtype (this rank's: shape {tuple(tensor.shape)}, {tensor.sparse_dim()} sparse "
            f"dimensions, {tensor.dtype}); every rank must pass a tensor of the same kind"
        )
    counts = headers[:, 0].tolist()
    most = max(counts)
    if most == 0:  # nothing anywhere: the sum has no entries
        tensor.copy_(local.to(tensor.device))
        return
    mine_i = torch.zeros((indices.shape[0], most), dtype=indices.dtype)
    mine_i[:, :nnz] = indices
    mine_v = torch.zeros((most, *values.shape[1:]), dtype=values.dtype)
    mine_v[:nnz] = values
    all_i = torch.empty((size, *mine_i.shape), dtype=mine_i.dtype)
    all_v = torch.empty((size, *mine_v.shape), dtype=mine_v.dtype)
    for out, mine, label in ((all_i, mine_i, "indices"), (all_v, mine_v, "values")):
        pycoll.all_gather_into_tensor(
            host_view(out, "all_reduce", label), host_view(mine, "all_reduce", label), group=group
        )
    summed = torch.sparse_coo_tensor(
        torch.cat([all_i[r, :, : counts[r]] for r in range(size)], dim=1),
        torch.cat([all_v[r, : counts[r]] for r in range(size)]),
        tensor.shape,
    ).coalesce()
    tensor.copy_(summed.to(tensor.device))
