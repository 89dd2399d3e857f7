"""What pycoll.rpc puts on the wire: pickled calls, results and errors.

Payloads are pickled here, with protocol 5: numpy arrays (and CPU torch
tensors, as numpy views of their memory) travel out of band, as separate
buffers that mpi4py.util.pkl5 sends as they are, without a copy into the
pickle stream and without MPI's 2 GiB count limit. pkl5 carries the result,
``(data, buffers)``, as one logical message.

The pickler is pycoll's own (a subclass of the standard one) for two things
the standard one cannot know: an RRef is pickled according to where the
message goes (pycoll.rpc.rref), and a torch tensor as its raw memory rather
than through ``torch.save``.
"""

from __future__ import annotations

import io
import pickle
import sys
import traceback
from typing import Any, List, Optional, Tuple

Payload = Tuple[bytes, List[pickle.PickleBuffer]]


class Pickler(pickle.Pickler):
    """A protocol-5 pickler for one message to worker ``dest``.

    While pickling, RRefs note here what the message does to them
    (``forks``: new user references it creates; ``pins``: references it hands
    back to their owner); the agent acts on both once pickling has succeeded,
    so a message that fails to pickle leaves no trace.
    """

    def __init__(self, dest: int, me: int) -> None:
        self.file = io.BytesIO()
        self.buffers: List[pickle.PickleBuffer] = []
        super().__init__(self.file, protocol=5, buffer_callback=self.buffers.append)
        self.dest = dest
        self.me = me
        self.forks: List[Any] = []  # (rref, fork id) pairs
        self.pins: List[Any] = []  # (rref id, pinned by the sender already)
        # Inside a distributed autograd context (pycoll.rpc.autograd): where the
        # tensors that require grad are recorded, and how they are reduced.
        self.autograd: Any = None

    def reducer_override(self, obj: Any) -> Any:
        reduce_for = getattr(type(obj), "_reduce_for", None)
        if reduce_for is not None:
            return reduce_for(obj, self)
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor:
            return _reduce_tensor(obj, self.autograd)
        return NotImplemented

    def payload(self, obj: Any) -> Payload:
        self.dump(obj)
        return self.file.getvalue(), self.buffers


def dumps(obj: Any, dest: int, me: int) -> Tuple[Payload, Pickler]:
    """``obj`` pickled for worker ``dest`` (and the pickler, for its notes)."""
    pickler = Pickler(dest, me)
    return pickler.payload(obj), pickler


def loads(payload: Payload) -> Any:
    data, buffers = payload
    return pickle.loads(data, buffers=buffers)


# -- torch tensors --------------------------------------------------------------------


def _reduce_tensor(t: Any, autograd: Any = None) -> Any:
    """A dense CPU tensor as its memory (a numpy view, sent out of band), its
    dtype and requires_grad; any other tensor as torch pickles it. Inside a
    distributed autograd context, a tensor that requires grad is reduced by
    the context's record (``autograd``), which notes it as sent."""
    if t.device.type != "cpu" or t.layout is not sys.modules["torch"].strided or t.is_quantized:
        return NotImplemented
    data = t.detach().resolve_conj().resolve_neg()
    try:
        array = data.numpy()
    except TypeError:  # a dtype numpy lacks (bfloat16, float8...): its bits
        torch = sys.modules["torch"]
        bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[data.element_size()]
        array = data.view(bits).numpy()
    dtype = str(t.dtype).split(".", 1)[1]
    if autograd is not None and t.requires_grad:
        return autograd.reduce(t, array, dtype)
    return rebuild_tensor, (array, dtype, t.requires_grad)


def rebuild_tensor(array: Any, dtype: str, requires_grad: bool) -> Any:
    import torch

    t = torch.from_numpy(array)
    want = getattr(torch, dtype)
    if t.dtype != want:
        t = t.view(want)
    if requires_grad:
        t.requires_grad_(True)
    return t


# -- errors ---------------------------------------------------------------------------


def remote_error(exc: BaseException, where: str) -> Tuple[Optional[type], str]:
    """An exception raised while serving a call, as torch's RPC reports it:
    its type (rebuilt at the caller where it can be) and a message naming the
    worker, with the remote traceback."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return type(exc), f"On {where}:\n{exc!r}\n{text}"


def rebuild_error(kind: Optional[type], message: str) -> BaseException:
    """The caller's copy of a remote exception: ``kind(message)`` where the
    type can be built from one string, else a RuntimeError with the message."""
    if kind is not None and issubclass(kind, BaseException):
        try:
            exc = kind(message)
            if exc.args == (message,):
                return exc
        except Exception:
            pass
    return RuntimeError(message)
