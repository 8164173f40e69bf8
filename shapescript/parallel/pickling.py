"""The wire's pickling: what the controller and the workers send each other, one message at a time.
A tensor goes as its raw bytes (torch's own pickling of each storage is ten times slower for a small
tensor); `pickle.loads` reads a message back. Its own module so that whatever sends (the pool, the
loader, Ray's workers) imports it without importing the worker."""

from __future__ import annotations

import copyreg
import io
import pickle
from typing import Any

import torch

# Each step below is skipped where it would change nothing: a message's small tensors cost a few
# µs each in torch's calls, on every round trip.


def _rebuild_tensor(data: bytearray, dtype: str, shape: tuple[int, ...], requires_grad: bool) -> torch.Tensor:
    kind = getattr(torch, dtype)
    if not data:
        t = torch.empty(shape, dtype=kind)
    else:
        t = torch.frombuffer(data, dtype=kind)  # one dimension: the shape's when it has one
        t = t if len(shape) == 1 else t.reshape(shape)
    return t.requires_grad_() if requires_grad else t


def _reduce_tensor(t: torch.Tensor) -> tuple[Any, ...]:
    """A tensor as its raw bytes: torch's own pickling goes through torch.save and torch.load of each
    storage, ten times slower for a small tensor. Tensors arrive on the CPU."""
    if t.layout != torch.strided or t.is_quantized or t.is_nested or t.is_meta:
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    data = t.detach() if t.requires_grad else t
    data = data if data.is_cpu else data.cpu()
    data = data if data.is_contiguous() else data.contiguous()
    try:
        array = data.numpy()  # any shape: its buffer is contiguous
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16...), or a conjugate view: as bytes
        array = data.resolve_conj().resolve_neg().reshape(-1).view(torch.uint8).numpy()
    raw = pickle.PickleBuffer(array.data)  # its memoryview: no copy until pickled
    return _rebuild_tensor, (raw, str(data.dtype).removeprefix("torch."), tuple(data.shape), t.requires_grad)


class _Pickler(pickle.Pickler):
    dispatch_table = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor}  # exact type: Parameter etc. as usual


def dumps(obj: Any) -> bytes:
    """`obj` as one message, for `Connection.send_bytes`; `pickle.loads` reads it."""
    out = io.BytesIO()
    _Pickler(out, protocol=5).dump(obj)
    return out.getvalue()
