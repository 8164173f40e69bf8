"""Operations across the batch axis on several devices: each worker holds a part of the batch, and
these combine the parts with one all-reduce, so every worker gets the whole batch's result. On one
device (no process group) they are the plain operations.

Gradients: `all_sum`'s backward is an all-reduce too (so a collective that value_and_grad
differentiates runs twice, once each way), and `value_and_grad` averages the workers' gradients
(one all-reduce per dtype). The loss is the same on every worker, so each worker's part of a sum
over the batch gets the gradient N times, which the average takes back; a term every worker
computes whole (say a penalty on the params) counts once, not once per worker.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

# Set by a worker: a context manager around each collective, given its .ss location, so that a
# worker stuck there can be reported ("was waiting for the other workers at train.ss:30:12").
status_hook: Callable[[str], AbstractContextManager[object]] | None = None


# Set by a test or a profiler: every collective is appended as (its .ss location, values, dtype).
# The DeviceTable (check/comms.py) says beforehand what this will hold.
recorded: list[tuple[str, int, torch.dtype]] | None = None


def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _waiting_at(where: str) -> AbstractContextManager[object]:
    return status_hook(where) if status_hook is not None else nullcontext()


def _all_reduce(t: torch.Tensor, where: str) -> None:
    """Every collective of the compiled code goes through here: a sum over the workers, in place."""
    if recorded is not None:
        recorded.append((where, t.numel(), t.dtype))
    with _waiting_at(where):
        dist.all_reduce(t)


class _AllSum(torch.autograd.Function):
    """A sum over the workers whose backward is one as well: each worker's part gets the gradient
    of every use of the sum, its own and the other workers'."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, where: str) -> torch.Tensor:  # type: ignore[override]
        ctx.where = where
        y = x.detach().clone()
        _all_reduce(y, where)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        total = grad.detach().clone()
        _all_reduce(total, ctx.where)
        return total, None


def all_sum(x: torch.Tensor, where: str = "") -> torch.Tensor:
    """The sum of every worker's `x` (each worker's part of a sum over the batch)."""
    return _AllSum.apply(x, where) if world() > 1 else x


def _sum_and_count(total: torch.Tensor, count: torch.Tensor | float, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """All-reduce a partial sum and its count together: one collective."""
    count_t = torch.as_tensor(count, dtype=total.dtype, device=total.device).reshape(1)
    packed = all_sum(torch.cat([total.reshape(-1), count_t]), where)
    return packed[:-1].reshape(total.shape), packed[-1]


def all_mean(x: torch.Tensor, dim: int | None, where: str = "") -> torch.Tensor:
    total = x.sum() if dim is None else x.sum(dim)
    count = x.numel() if dim is None else x.shape[dim]
    s, n = _sum_and_count(total, float(count), where)
    return s / n


def all_masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None, where: str = "") -> torch.Tensor:
    weights = mask.expand_as(x).to(x.dtype)
    total = (x * weights).sum() if dim is None else (x * weights).sum(dim)
    count = weights.sum() if dim is None else weights.sum(dim)
    if dim is None:
        s, n = _sum_and_count(total, count.detach(), where)
        return s / n
    packed = all_sum(torch.stack([total, count.detach()]), where)
    return packed[0] / packed[1]


def all_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, where: str = "") -> torch.Tensor:
    s, n = _sum_and_count(F.cross_entropy(logits, labels, reduction="sum"), float(labels.numel()), where)
    return s / n


def all_masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
                             where: str = "") -> torch.Tensor:
    weights = mask.to(logits.dtype)
    losses = F.cross_entropy(logits, labels, reduction="none")
    s, n = _sum_and_count((losses * weights).sum(), weights.sum().detach(), where)
    return s / n


def average_grads(grads: list[torch.Tensor], where: str = "value_and_grad") -> list[torch.Tensor]:
    """Every worker's gradients averaged, in one all-reduce per dtype (flattened into one buffer)."""
    n = world()
    if n == 1:
        return grads
    out = list(grads)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for k, g in enumerate(grads):
        by_dtype.setdefault(g.dtype, []).append(k)
    for dtype, ks in by_dtype.items():
        flat = torch.cat([grads[k].reshape(-1) for k in ks])
        _all_reduce(flat, where)
        flat /= n
        for k, piece in zip(ks, flat.split([grads[k].numel() for k in ks])):
            out[k] = piece.view_as(grads[k])
    return out


def all_batch_norm(x: torch.Tensor, stats: object, mode: object, axis: int, where: str = "") -> torch.Tensor:
    """batch_norm with the batch's statistics from every worker: the sums and sums of squares per
    channel and the count, 2·C + 1 values in f64, in one all-reduce."""
    if not mode.training:  # type: ignore[attr-defined]  (Eval: the running statistics, nothing to share)
        moved = x.movedim(axis, 1)
        out = F.batch_norm(moved, stats.mean, stats.var, training=False, eps=1e-5)  # type: ignore[attr-defined]
        return out.movedim(1, axis)
    channels = x.shape[axis]
    flat = x.movedim(axis, -1).reshape(-1, channels).to(torch.float64)
    count = torch.tensor([float(flat.shape[0])], dtype=torch.float64, device=x.device)
    packed = all_sum(torch.cat([flat.sum(0), (flat * flat).sum(0), count]), where)
    total, squares, n = packed[:channels], packed[channels:-1], packed[-1]
    mean = total / n
    var = squares / n - mean * mean
    shape = [1] * x.dim()
    shape[axis] = channels
    out = (x - mean.to(x.dtype).view(shape)) / torch.sqrt(var.to(x.dtype).view(shape) + 1e-5)
    with torch.no_grad():  # PyTorch's running statistics: momentum 0.1, the unbiased variance
        stats.mean.mul_(0.9).add_(0.1 * mean.to(stats.mean.dtype))  # type: ignore[attr-defined]
        stats.var.mul_(0.9).add_(0.1 * (var * n / (n - 1)).to(stats.var.dtype))  # type: ignore[attr-defined]
    return out
