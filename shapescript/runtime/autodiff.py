"""value_and_grad: a function of the program and its gradient with respect to a model's trained
params, on one device or several (the gradients averaged over the workers as the backward pass makes
them, or kept each worker's own until read whole), and, under `precision mixed f16`, of its loss
scaled (runtime/loss_scale.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from shapescript.errors import ShapeError
from shapescript.runtime.collectives import BucketedAverage, average_grads, bucketed_average, world
from shapescript.runtime.grads import Grads
from shapescript.runtime.loss_scale import scale_of
from shapescript.runtime.model import Model, type_text
from shapescript.runtime.sharding import keeping_pieces, sharding


def value_and_grad(f: Callable[..., torch.Tensor], m: Model, *args: Any, where: str = "value_and_grad",
                   sync: bool = True, scaled: bool = False) -> tuple[torch.Tensor, Grads]:
    """`f(m, *args)` and its gradient with respect to `m`'s trained params. `sync=False` (the
    compiler's choice where the gradients only add up before an update, plan/accumulate.py): a whole
    model's gradients stay this worker's own until read whole (grads.py). `scaled` (`precision mixed
    f16`): the gradient of `f` times `m`'s loss scale, divided by it again (runtime/loss_scale.py)."""
    # On N workers each one's backward makes N times its part of the gradient (every worker's loss is
    # the whole batch's, and seeds it with 1), which the average undoes: seeded with scale / N, each
    # holds the values one device would, and overflows where one device would.
    seed = scale_of(m).scale / world() if scaled else None
    v, grads = _value_and_grad(f, m, args, where, sync, seed)
    if seed is None:
        return v, grads
    return v, Grads(grads.model_spec, [t / seed for t in grads.tensors], grads.pieces, grads.pending)


def _value_and_grad(f: Callable[..., torch.Tensor], m: Model, args: tuple, where: str, sync: bool,
                    scale: float | None) -> tuple[torch.Tensor, Grads]:
    params = m.params()
    pieces = sharding(m)
    pending = not sync and pieces is None
    # A whole model's gradients are averaged as the backward makes them (None: after it)
    buckets = bucketed_average(params, where) if pieces is None and not pending else None
    grad_was = torch.is_grad_enabled()
    torch._C._set_grad_enabled(True)  # as torch.enable_grad(), without a context object every step
    try:
        if pieces is None:
            v, grads = _differentiate(f, m, args, params, buckets, scale)
        else:
            with keeping_pieces(m):
                v, grads = _differentiate(f, m, args, params, None, scale)
    finally:
        torch._C._set_grad_enabled(grad_was)
    tensors = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
    if pending:
        return v.detach(), Grads(m.spec, tensors, pending=True)
    if pieces is None:
        mean = buckets.finish(tensors) if buckets is not None else average_grads(tensors, where)
        return v.detach(), Grads(m.spec, mean)
    # A part's gradient is already every worker's (a reduce-scatter, or its own heads'): N times its
    # share of the whole batch's, as each worker's loss seeds it with 1. A whole param's is averaged.
    whole = average_grads([t for t, part in zip(tensors, pieces.parted) if not part], where)
    averaged = iter(whole)
    out = [t / pieces.world if part else next(averaged) for t, part in zip(tensors, pieces.parted)]
    return v.detach(), Grads(m.spec, out, pieces.parted)


def _differentiate(f: Callable[..., torch.Tensor], m: Model, args: tuple, params: list[torch.Tensor],
                   buckets: BucketedAverage | None, scale: float | None = None
                   ) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]:
    """`f(m, *args)`, checked to be a float scalar, and its gradients (None where a param has none);
    with a `scale`, the gradients of `f(m, *args) * scale`."""
    v = f(m, *args)
    if not isinstance(v, torch.Tensor) or v.ndim != 0 or not v.is_floating_point():
        what = (f"a {type_text(v.shape, v.dtype)} tensor" if isinstance(v, torch.Tensor)
                else f"a {type(v).__name__}")
        raise ShapeError(f"value_and_grad: {getattr(f, '__name__', 'the function')} returned "
                         f"{what}, expected a float scalar []")
    if not (v.requires_grad and params):  # v does not depend on any param: autograd.grad would refuse
        return v, (None,) * len(params)
    seed = v if scale is None else v * scale
    if buckets is None:
        return v, torch.autograd.grad(seed, params, allow_unused=True)
    with buckets:
        return v, torch.autograd.grad(seed, params, allow_unused=True)
