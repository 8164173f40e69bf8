"""`shard params` on the workers: each device holds a piece of every param, gathered where it's read.

A param of n values is flattened and cut into N pieces of ceil(n / N) values each, the last padded
with zeros; worker k holds piece k, and so its optimizer keeps state for that piece only (AdamW and
SGD work value by value, so a piece's update is the whole param's, cut). The padding stays zero:
its gradient is zero, and so is every update of it.

Reading a param (`gather_param`, printed by the code generator for each read of a param on the
workers) all-gathers the pieces into the whole param; its backward reduce-scatters the gradient,
so each worker gets the sum over the workers of its own piece's gradient. The gathered param is not
kept for the backward pass: while a value is differentiated (`keeping_pieces`), autograd saves a
reference to the read instead of the tensor, and the backward pass gathers it again once, when
first needed, and drops it after the read's own backward. So each read sends an all-gather in the
forward pass and, differentiated, an all-gather and a reduce-scatter in the backward pass, which
is what the DeviceTable (plan/comms.py) counts.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shapescript.runtime.collectives import Op, collective, record
from shapescript.runtime.heads import gather_along
from shapescript.runtime.model import Model, ModelSpec, ParamSpec, SubSpec, leaves, live_name

SHARD = "_shard"  # a sharded model's attribute (and each of its sub-models'): its `Pieces`


@dataclass(frozen=True)
class Pieces:
    """How a model's params are cut over the workers: this worker's rank of `world`, and the whole
    shape of each param it holds a part of, by its live name (`_m_w1`, as generated code reads it):
    a flat piece (`shard params`), or along an axis for those in `heads` (`split H`). A param in
    neither is whole. `parted`: for each of the model's `params()`, whether it is a part; `gathered`:
    whether any of them is a flat piece, gathered where it's read."""
    rank: int
    world: int
    shapes: dict[str, tuple[int, ...]]
    heads: dict[str, int]
    parted: tuple[bool, ...] = ()
    gathered: bool = False


def piece_size(numel: int, world: int) -> int:
    """The values in each worker's piece of a param of `numel` values: the last one padded."""
    return math.ceil(numel / world)


def cut(whole: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Worker `rank`'s piece of `whole`: its flat values from rank·size on, padded with zeros."""
    size = piece_size(whole.numel(), world)
    flat = whole.detach().reshape(-1)
    piece = torch.zeros(size, dtype=whole.dtype, device=whole.device)
    start = min(rank * size, flat.numel())
    mine = flat[start:start + size]
    piece[:mine.numel()] = mine
    return piece


def sharding(model: Any) -> Pieces | None:
    """How a sharded model's params are cut; None for a model that holds them whole."""
    value = getattr(model, "__dict__", {}).get(SHARD)
    return value if isinstance(value, Pieces) else None


def _models(model: Model) -> Iterator[Model]:
    """The model and every sub-model, each once, depth-first in declaration order."""
    yield model
    for member in model.spec.members:
        if isinstance(member, SubSpec):
            value = model.__dict__[live_name(member.name)]
            for sub in value if isinstance(value, tuple) else (value,):
                yield from _models(sub)


def init_parts(spec: ModelSpec, seed: int, device: torch.device, rank: int, world: int, pieces: bool,
               heads: Mapping[tuple[str, str], int]) -> Model:
    """`spec`'s model as this worker holds it: its part of each param, along its axis for a param in
    `heads` ((model, param) -> axis: `split H`), a flat piece of every other one if `pieces` (`shard
    params`); buffers whole. Each param is drawn whole, as one device draws it, and cut at once."""
    def keep(owner: ModelSpec, param: ParamSpec, whole: torch.Tensor) -> torch.Tensor:
        axis = heads.get((owner.name, param.name))
        return whole if axis is None and not pieces else part_of(whole, rank, world, axis)
    return mark_parts(Model.init(spec, seed, device, keep), rank, world, pieces, heads)


def mark_parts(model: Model, rank: int, world: int, pieces: bool, heads: Mapping[tuple[str, str], int]) -> Model:
    """Record on `model` and each sub-model which of its params are parts (`init_parts` cut them)."""
    for m in _models(model):
        shapes, axes = {}, {}
        for member in m.spec.members:
            if not (isinstance(member, ParamSpec) and member.kind == "param"):
                continue
            name, axis = live_name(member.name), heads.get((m.spec.name, member.name))
            if axis is None and not pieces:
                continue
            shapes[name] = member.shape
            if axis is not None:
                axes[name] = axis
        m.__dict__[SHARD] = Pieces(rank, world, shapes, axes)
    for m in _models(model):
        named = [(name, m._leaf(name)) for name, leaf in leaves(m.spec) if leaf.kind == "param"]
        own = m.__dict__[SHARD]
        m.__dict__[SHARD] = dataclasses.replace(own, parted=tuple(_is_part(m, name) for name, _ in named),
                                                gathered=any(_is_part(m, name, flat=True) for name, _ in named))
    return model


def part_of(whole: torch.Tensor, rank: int, world: int, axis: int | None) -> torch.Tensor:
    """Worker `rank`'s part of a whole param: along `axis` (a block of whole heads), or a flat piece."""
    if axis is None:
        return cut(whole, rank, world)
    size = whole.shape[axis] // world
    return whole.detach().narrow(axis, rank * size, size).clone()


def owner(model: Model, dotted: str) -> tuple[Model, str]:
    """The model (or sub-model) that holds leaf `dotted` (`blocks.0.attn.w_o`), and the leaf's live name."""
    *path, last = dotted.split(".")
    obj: Any = model
    for part in path:
        obj = obj[int(part)] if isinstance(obj, tuple) else obj.__dict__[live_name(part)]
    return obj, live_name(last)


def _is_part(model: Model, dotted: str, flat: bool = False) -> bool:
    """Whether each worker holds a part of leaf `dotted` (`flat`: a flat piece, not along H)."""
    holder, name = owner(model, dotted)
    pieces = sharding(holder)
    return pieces is not None and name in pieces.shapes and not (flat and name in pieces.heads)


def whole_of(model: Model, dotted: str, part: torch.Tensor) -> torch.Tensor:
    """Leaf `dotted`'s whole value from every worker's `part` of it (a copy if it is whole)."""
    holder, name = owner(model, dotted)
    pieces = sharding(holder)
    if pieces is None or name not in pieces.shapes:
        return part.detach().clone()
    axis = pieces.heads.get(name)
    if axis is not None:
        return gather_along(part.detach(), axis, f"the state of `{dotted}`").clone()
    return gathered(part.detach(), pieces.shapes[name], f"the state of `{dotted}`").clone()


def this_part(model: Model, dotted: str, whole: torch.Tensor) -> torch.Tensor:
    """This worker's part of leaf `dotted`'s whole value (the value itself if the leaf is whole)."""
    holder, name = owner(model, dotted)
    pieces = sharding(holder)
    if pieces is None or name not in pieces.shapes:
        return whole
    return part_of(whole, pieces.rank, pieces.world, pieces.heads.get(name))


def gathered(pieces: torch.Tensor, shape: tuple[int, ...], where: str) -> torch.Tensor:
    """The whole param from every worker's piece (one all-gather, padded to a multiple of N)."""
    world = dist.get_world_size()
    flat = torch.empty(pieces.numel() * world, dtype=pieces.dtype, device=pieces.device)
    record(where, flat.numel(), flat.dtype, "all-gather")
    with collective(Op.ALL_GATHER, pieces.numel(), pieces.dtype, where):
        dist.all_gather_single(flat, pieces.detach())
    return flat[:math.prod(shape)].view(shape)


def scattered(grad: torch.Tensor, size: int, where: str) -> torch.Tensor:
    """This worker's piece of the sum over the workers of `grad` (one reduce-scatter)."""
    world = dist.get_world_size()
    flat = torch.zeros(size * world, dtype=grad.dtype, device=grad.device)
    flat[:grad.numel()] = grad.reshape(-1)
    out = torch.empty(size, dtype=grad.dtype, device=grad.device)
    record(where, flat.numel(), flat.dtype, "reduce-scatter")
    with collective(Op.REDUCE_SCATTER, flat.numel(), flat.dtype, where):
        dist.reduce_scatter_single(out, flat)
    return out


class _Read:
    """One read of a sharded param in a differentiated pass: what gathers it again for backward."""

    __slots__ = ("piece", "shape", "where", "again", "__weakref__")

    def __init__(self, piece: torch.Tensor, shape: tuple[int, ...], where: str) -> None:
        self.piece, self.shape, self.where = piece, shape, where
        self.again: torch.Tensor | None = None  # the param gathered again, until the read's backward

    def whole(self) -> torch.Tensor:
        if self.again is None:
            self.again = gathered(self.piece, self.shape, self.where)
        return self.again

    def done(self) -> None:
        """The read's backward: the gathered param is needed no more. Gathered once in every backward
        pass, even where nothing saved it (a first layer's weight, whose input has no gradient), so
        that what a step sends is what the DeviceTable says."""
        self.whole()
        self.again = None


@dataclass(frozen=True)
class _Saved:
    """What autograd keeps instead of a view of a gathered param: the read and the view's geometry."""
    read: _Read
    size: torch.Size
    stride: tuple[int, ...]
    offset: int | torch.SymInt


# While a value is differentiated (`keeping_pieces`): each live gathered param by its storage.
_live: dict[int, tuple[weakref.ref[torch.Tensor], _Read]] | None = None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, piece: torch.Tensor, shape: tuple[int, ...], where: str) -> torch.Tensor:
        whole = gathered(piece, shape, where)
        ctx.read = _Read(piece, shape, where)
        if _live is not None:
            _live[whole.untyped_storage().data_ptr()] = (weakref.ref(whole), ctx.read)
        return whole

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        read: _Read = ctx.read
        read.done()
        return scattered(grad, read.piece.numel(), read.where), None, None


def gather_param(model: Model, name: str, where: str) -> torch.Tensor:
    """The live param `name` (`_m_w1`) of `model`, whole: gathered if the model is sharded."""
    own = model.__dict__
    piece = own[name]
    pieces = own.get(SHARD)
    if pieces is None:
        return piece
    return _Gather.apply(piece, pieces.shapes[name], where)


def _pack(t: torch.Tensor) -> Any:
    entry = _live.get(t.untyped_storage().data_ptr()) if _live is not None and t.layout == torch.strided else None
    if entry is None or entry[0]() is None:
        return t
    return _Saved(entry[1], t.size(), t.stride(), t.storage_offset())


def _unpack(saved: Any) -> torch.Tensor:
    if not isinstance(saved, _Saved):
        return saved
    whole = saved.read.whole()
    return whole.as_strided(saved.size, saved.stride, saved.offset)


@contextmanager
def keeping_pieces(model: Model) -> Iterator[None]:
    """Differentiate a value of a sharded `model` without keeping its gathered params: autograd
    saves each read instead, gathered again in the backward pass. Nothing for a whole model."""
    global _live
    pieces = sharding(model)
    if pieces is None or not pieces.gathered or _live is not None:
        yield
        return
    _live = {}
    try:
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            yield
    finally:
        _live = None


def whole_state(model: Model) -> dict[str, torch.Tensor]:
    """Every param and buffer of a model whose params are in parts, whole (gathered from the parts)."""
    return {name: whole_of(model, name, model._leaf(name)) for name, _ in leaves(model.spec)}
