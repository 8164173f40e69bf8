"""Standard-library operations that are more than one torch call: gradient norms and clipping,
and the causal mask."""

from __future__ import annotations

import torch

from shapescript.runtime.optim import Grads


def grad_norm(g: Grads) -> torch.Tensor:
    """The 2-norm of all of a model's gradients together, as torch's clip_grad_norm_ measures it."""
    return torch.nn.utils.get_total_norm(g.tensors)


def clip_norm(g: Grads, max_norm: float) -> Grads:
    """The gradients scaled down so that their norm is at most `max_norm` (torch's clip_grad_norm_
    formula, without changing them in place)."""
    total = torch.nn.utils.get_total_norm(g.tensors)
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return Grads(g.model_spec, [t * scale for t in g.tensors])


def causal(rows: int, cols: int, device: torch.device | str) -> torch.Tensor:
    """True where a column lies after its row: the future, which a causal model must not see."""
    return torch.ones(rows, cols, dtype=torch.bool, device=device).triu(1)


def batch_norm(x: torch.Tensor, stats: object, mode: object, axis: int) -> torch.Tensor:
    """PyTorch's batch_norm with the channels on `axis`: batch statistics and a momentum-0.1 update
    of the running ones in Train, the running ones in Eval."""
    moved = x if axis == 1 else x.movedim(axis, 1)
    out = torch.nn.functional.batch_norm(moved, stats.mean, stats.var, training=mode.training,  # type: ignore
                                         momentum=0.1, eps=1e-5)
    return out if axis == 1 else out.movedim(1, axis)
