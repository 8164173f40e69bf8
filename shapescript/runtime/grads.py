"""Gradients: a model's trained params' gradients, aligned with `Model.params()`, and the
arithmetic a program does with them (issue 39: accumulation over micro-batches).

Gradients of one model add and subtract, and scale by a number or a float `[]`; `g.w` reads one
param's gradient. On several devices every worker holds the same whole gradients (value_and_grad
averaged them), so each worker's arithmetic is one device's. Gradients that only add up before an
update may stay each worker's own (`pending`: value_and_grad(..., sync=False), as DDP's no_sync)
until something reads them whole (`synced`): averaging is linear, so one all-reduce of their sum
gives what one device computes, for one all-reduce per optimizer step instead of one per micro-batch. With `shard params` or `split H` a
worker holds a piece of some params' gradients (`pieces`): the arithmetic works piece by piece,
but a field read of such a param would be a piece, and is refused.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch

from shapescript.errors import ShapeError
from shapescript.runtime.collectives import average_grads
from shapescript.runtime.model import ModelSpec, SubSpec, param_names


class Grads:
    """The gradients of a model's trained params, aligned with `model.params()`. `pieces`: for each,
    whether each worker holds a part of it (`shard params`, `split H`), so that a norm adds up every
    worker's squares of them; () where every worker holds them all. `pending`: each worker's own,
    not yet averaged over the workers (see `synced`)."""

    __slots__ = ("model_spec", "tensors", "pieces", "pending")

    def __init__(self, model_spec: ModelSpec, tensors: list[torch.Tensor], pieces: tuple[bool, ...] = (),
                 pending: bool = False) -> None:
        self.model_spec = model_spec
        self.tensors = tensors
        self.pieces = pieces
        self.pending = pending

    def synced(self, where: str) -> Grads:
        """These gradients averaged over the workers, once: in one all-reduce per dtype the first time
        they are read whole (every worker reads them at the same point of the same code)."""
        if self.pending:
            self.tensors = average_grads(self.tensors, where)
            self.pending = False
        return self

    def named(self) -> dict[str, torch.Tensor]:
        return dict(zip(param_names(self.model_spec), self.tensors))

    def __repr__(self) -> str:
        return f"Grads[{self.model_spec.name}]({', '.join(param_names(self.model_spec))})"

    def _with(self, other: Grads, combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Grads:
        if not isinstance(other, Grads) or other.model_spec != self.model_spec:
            what = f"Grads[{other.model_spec.name}]" if isinstance(other, Grads) else type(other).__name__
            raise ShapeError(f"the gradients of a {self.model_spec.name} and {what} don't add up")
        # A worker's own and an average (the same on every worker, so averaging it again changes
        # nothing) combine into a worker's own: its average is the average's combination.
        return Grads(self.model_spec, [combine(a, b) for a, b in zip(self.tensors, other.tensors)], self.pieces,
                     self.pending or other.pending)

    def _scaled(self, by: Any, scale: Callable[[torch.Tensor, Any], torch.Tensor]) -> Grads:
        if not (isinstance(by, numbers.Real) and not isinstance(by, bool)
                or isinstance(by, torch.Tensor) and by.ndim == 0):
            return NotImplemented
        return Grads(self.model_spec, [scale(t, by) for t in self.tensors], self.pieces, self.pending)

    def __add__(self, other: Grads) -> Grads:
        return self._with(other, torch.add)

    def __sub__(self, other: Grads) -> Grads:
        return self._with(other, torch.sub)

    def __mul__(self, by: Any) -> Grads:
        return self._scaled(by, torch.mul)

    __rmul__ = __mul__

    def __truediv__(self, by: Any) -> Grads:
        return self._scaled(by, torch.div)


def grad_field(g: Grads, name: str, where: str = "") -> torch.Tensor | Grads:
    """`g.name`: a param's gradient, or a sub-model's gradients (a Grads of it)."""
    g = g.synced(where)
    names = param_names(g.model_spec)
    pieces = g.pieces or (False,) * len(names)
    sub = next((m for m in g.model_spec.members if isinstance(m, SubSpec) and m.name == name), None)
    picked = [k for k, n in enumerate(names) if (n.startswith(name + ".") if sub is not None else n == name)]
    if any(pieces[k] for k in picked):
        raise ShapeError(f"{where}: the gradient of `{name}` is in pieces on the workers (`shard params` or "
                         f"`split H`), so it can't be read whole; read it on one device or without that option")
    if sub is not None:
        return Grads(sub.model, [g.tensors[k] for k in picked], tuple(pieces[k] for k in picked) if g.pieces else ())
    assert len(picked) == 1, (name, names)
    return g.tensors[picked[0]]
