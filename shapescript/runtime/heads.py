"""`split H` on the workers: each device holds its part of every value split along H (a block of
whole heads), as plan/layout.py planned; the compiled code calls these where the plan gathers a
value whole (`gather_heads`, an all-gather whose backward is a reduce-scatter) or cuts a whole value
to this device's part (`cut_heads`, no communication). A sum of partial results is `all_sum`.

Gradients, every device seeding the loss's with 1: a whole value's gradients add up over the
devices to N times the whole gradient, and a split value's part holds N times its own. So a
gather's backward adds up every device's gradient of its part (a reduce-scatter), a cut's keeps its
part's, a sum's gives each device every device's (all_sum's all-reduce), and value_and_grad
averages the gradients of whole params over the devices and divides a split param's by N.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from shapescript.errors import ShapeError
from shapescript.runtime.collectives import Op, collective, record, world


def gather_along(part: torch.Tensor, axis: int, where: str) -> torch.Tensor:
    """Every device's part along `axis`, in order: the whole value (one all-gather)."""
    n = dist.get_world_size()
    flat = torch.empty((n,) + tuple(part.shape), dtype=part.dtype, device=part.device)
    record(where, flat.numel(), flat.dtype, "all-gather")
    with collective(Op.ALL_GATHER, part.numel(), part.dtype, where):
        dist.all_gather_single(flat.view(-1), part.detach().contiguous().view(-1))
    return flat.movedim(0, axis).flatten(axis, axis + 1)  # the devices' parts in order along the axis


def _scatter(whole: torch.Tensor, axis: int, where: str) -> torch.Tensor:
    n = dist.get_world_size()
    parts = whole.unflatten(axis, (n, whole.shape[axis] // n)).movedim(axis, 0).contiguous()
    out = torch.empty(parts.shape[1:], dtype=whole.dtype, device=whole.device)
    record(where, parts.numel(), parts.dtype, "reduce-scatter")
    with collective(Op.REDUCE_SCATTER, parts.numel(), parts.dtype, where):
        dist.reduce_scatter_single(out.view(-1), parts.view(-1))
    return out


class _GatherHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, part: torch.Tensor, axis: int, where: str) -> torch.Tensor:
        ctx.axis, ctx.where = axis, where
        return gather_along(part, axis, where)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _scatter(grad, ctx.axis, ctx.where), None, None


def gather_heads(part: torch.Tensor, axis: int, where: str) -> torch.Tensor:
    """The whole value from every device's part along `axis`."""
    return _GatherHeads.apply(part, axis, where) if world() > 1 else part


def cut_heads(value: Any, axes: int | None | tuple[int | None, ...], where: str = "") -> Any:
    """This device's part of a whole value along `axes` (a tuple's: each element along its own)."""
    if isinstance(value, tuple):
        assert isinstance(axes, tuple)
        return tuple(cut_heads(v, a, where) for v, a in zip(value, axes))
    if axes is None or world() == 1:
        return value
    assert isinstance(axes, int)
    n = dist.get_world_size()
    whole = value.shape[axes]
    if whole % n:  # a generic dim that another call binds to H, given a size the devices don't divide
        raise ShapeError(f"{where}: this value is split along its axis {axes} across the {n} devices (split H), "
                         f"but that axis has {whole} entries, not a multiple of {n}")
    return value.narrow(axes, dist.get_rank() * (whole // n), whole // n)
