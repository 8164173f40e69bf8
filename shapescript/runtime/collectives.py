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

import sys
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shapescript.errors import ShapeError
from shapescript.names import MEMBER_PREFIX

# Set by a worker: a context manager around each collective, given its .ss location, so that a
# worker stuck there can be reported ("was waiting for the other workers at train.ss:30:12").
status_hook: Callable[[str], AbstractContextManager[object]] | None = None


# Set by a test or a profiler: every collective is appended as (its .ss location, values, dtype,
# operation: "all-reduce", "all-gather", "reduce-scatter"). The DeviceTable (check/comms.py) says
# beforehand what this will hold.
recorded: list[tuple[str, int, torch.dtype, str]] | None = None

# Set by a worker that times its calls (parallel/timeline.py): told each collective's operation
# just before it runs, for the timeline's columns.
operation_hook: Callable[[str], None] | None = None


# Set by a worker around each call: where its part lies in the whole batch, (offset, the whole
# batch's size), so that a random draw can be the whole batch's and each worker take its rows.
# None on one device and in a call with no split argument: a value's rows are all the batch's.
_batch_part: tuple[int, int] | None = None


def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@contextmanager
def in_batch_part(part: tuple[int, int] | None) -> Iterator[None]:
    """Run a call with this worker's part of the batch at (offset, whole batch's size)."""
    global _batch_part
    was, _batch_part = _batch_part, part
    try:
        yield
    finally:
        _batch_part = was


def batch_part() -> tuple[int, int] | None:
    """(offset of this worker's part, the whole batch's size) in the current call; None if unsplit."""
    return _batch_part


def caller_location(depth: int = 2) -> str:
    """The .ss location of the generated line `depth` frames up (its module's SS_LINES), for an error
    raised where the compiled code passes none (the all_* functions are given theirs)."""
    frame = sys._getframe(depth)
    lines, file = frame.f_globals.get("SS_LINES"), frame.f_globals.get("SS_FILE")
    if not isinstance(lines, dict) or frame.f_lineno not in lines:
        return "(compiled code)"
    line, col = lines[frame.f_lineno]
    return f"{file}:{line}:{col}"


def running_statistics(stats: object) -> tuple[torch.Tensor, torch.Tensor]:
    """batch_norm's running mean and var: the stats model's live buffers, which the update changes in
    place (reading `stats.mean` from Python gives a copy)."""
    return stats.__dict__[MEMBER_PREFIX + "mean"], stats.__dict__[MEMBER_PREFIX + "var"]


def check_statistics_count(count: int, where: str) -> None:
    """batch_norm in Train refuses a batch with one value per channel, as PyTorch does (the variance
    of one value is no statistic): on every device count alike, from the whole batch's count."""
    if count == 1:
        raise ShapeError(f"{where}: batch_norm in Train needs more than one value per channel for the "
                         f"batch's statistics, but this batch has 1; use a batch of 2 or more "
                         f"examples, or Eval, which uses the running statistics")


def waiting_at(where: str) -> AbstractContextManager[object]:
    """Around each collective: a worker stuck in it says where (`status_hook`)."""
    return status_hook(where) if status_hook is not None else nullcontext()


def record(where: str, values: int, dtype: torch.dtype, op: str) -> None:
    """Every collective of the compiled code is recorded here, when a test or a profiler asks."""
    if recorded is not None:
        recorded.append((where, values, dtype, op))
    if operation_hook is not None:
        operation_hook(op)


def _all_reduce(t: torch.Tensor, where: str) -> None:
    """A sum over the workers, in place: every all-reduce of the compiled code goes through here."""
    record(where, t.numel(), t.dtype, "all-reduce")
    with waiting_at(where):
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


# batch_norm's constants, PyTorch's defaults: one device (runtime/ops.py) and several use these.
BATCH_NORM_MOMENTUM = 0.1
BATCH_NORM_EPS = 1e-5


def all_batch_norm(x: torch.Tensor, stats: object, mode: object, axis: int, where: str = "") -> torch.Tensor:
    """batch_norm with the batch's statistics from every worker: the sums and sums of squares per
    channel and the count, 2·C + 1 values in f64, in one all-reduce."""
    if not mode.training:  # type: ignore[attr-defined]  (Eval: the running statistics, nothing to share)
        moved = x.movedim(axis, 1)
        out = F.batch_norm(moved, *running_statistics(stats), training=False, eps=BATCH_NORM_EPS)
        return out.movedim(1, axis)
    channels = x.shape[axis]
    flat = x.movedim(axis, -1).reshape(-1, channels).to(torch.float64)
    count = torch.tensor([float(flat.shape[0])], dtype=torch.float64, device=x.device)
    packed = all_sum(torch.cat([flat.sum(0), (flat * flat).sum(0), count]), where)
    total, squares, n = packed[:channels], packed[channels:-1], packed[-1]
    part = batch_part()
    if part is None or part[1] == 1:  # only a batch of one can give one value per channel: else no host sync
        check_statistics_count(int(n.item()), where)  # the whole count, so every worker raises together
    mean = total / n
    var = squares / n - mean * mean
    shape = [1] * x.dim()
    shape[axis] = channels
    out = (x - mean.to(x.dtype).view(shape)) / torch.sqrt(var.to(x.dtype).view(shape) + BATCH_NORM_EPS)
    with torch.no_grad():  # PyTorch's running statistics: the momentum, the unbiased variance
        running_mean, running_var = running_statistics(stats)
        keep = 1 - BATCH_NORM_MOMENTUM
        running_mean.mul_(keep).add_(BATCH_NORM_MOMENTUM * mean.to(running_mean.dtype))
        running_var.mul_(keep).add_(BATCH_NORM_MOMENTUM * (var * n / (n - 1)).to(running_var.dtype))
    return out
