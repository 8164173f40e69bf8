"""The DeviceTable's records (plan/comms.py builds the table of them): each collective, what a call
or a line sends, and how each value lies on the devices, with their sizes as sympy expressions and
the words `shapescript comms` prints them in."""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import Any

import sympy

from ..dtypes import ELEMENTS
from ..errors import Span
from ..shapes.plans import Where
from .sizes_text import bytes_text

DTYPE_BYTES = {name: e.bytes for name, e in ELEMENTS.items()}


class Named(sympy.Dummy):
    """A generic dim in the table's sizes, the batch's `b`: still a dim of its own (a Dummy), but
    printed as written, `2048*b`, where sympy prints a Dummy as `_b`."""

    def _sympystr(self, printer: Any) -> str:
        return str(self.name)


class _Sized(abc.ABC):
    """A record with a size: `bytes`, and `bytes_text`, as `shapescript comms` writes it (`2,048·b bytes`)."""

    @property
    @abc.abstractmethod
    def bytes(self) -> sympy.Expr: ...

    @property
    def bytes_text(self) -> str:
        return bytes_text(self.bytes)


@dataclass(frozen=True)
class Collective(_Sized):
    """One collective of the compiled program, as one run of its line sends it."""
    op: str  # "all-reduce"
    what: str  # what it combines, in words
    fn: str  # the function whose line it is on
    span: Span
    count: sympy.Expr  # how many values
    dtype: str

    @property
    def bytes(self) -> sympy.Expr:
        size: sympy.Expr = self.count * DTYPE_BYTES[self.dtype]
        return size


@dataclass(frozen=True)
class Sent(_Sized):
    """A collective as a call runs it: `times` is 2 when the backward pass runs it again, and `via`
    the calls it is reached through, outermost first (empty: in the function's own body); in a loop
    over a stack of L models, L times as often."""
    collective: Collective
    times: int | sympy.Expr = 1
    via: tuple[str, ...] = ()

    @property
    def bytes(self) -> sympy.Expr:
        size: sympy.Expr = self.collective.bytes * self.times
        return size


@dataclass(frozen=True)
class LineItem(_Sized):
    """What one line sends: a collective of its own, or a call whose callee sends something.
    `backward`: what the backward pass sends instead of the collective again (a gathered param's
    gradient, reduce-scattered); None for a collective the backward pass runs as big."""
    span: Span
    fn: str  # the function whose line it is
    sent: tuple[Sent, ...]  # for a call: everything the callee sends, its calls included
    collective: Collective | None = None
    callee: str | None = None
    differentiated: bool = False  # the callee, under value_and_grad: forward and backward
    backward: Collective | None = None
    again: bool = False  # a sharded param's gather, run again in the backward pass before `backward`
    repeats: sympy.Expr = sympy.Integer(1)  # how often one call of `fn` runs the line (a loop over a stack)

    @property
    def bytes(self) -> sympy.Expr:
        return sympy.Add(*(s.bytes for s in self.sent))


class ValueKind(enum.StrEnum):
    """How a value lies on the devices: SPLIT along an axis (each device its part of the batch),
    HEADS (split along `split H`'s dim), WHOLE on every device, a MODEL's copy (or pieces) on every
    device, an OPTIMIZER's state beside its model's, or in the CONTROLLER only."""

    SPLIT = "split"
    HEADS = "heads"
    WHOLE = "whole"
    MODEL = "model"
    OPTIMIZER = "optimizer"
    CONTROLLER = "controller"


@dataclass(frozen=True)
class Layout:
    """How one value lies on the devices (`kind`; SPLIT and HEADS along `axis`)."""
    name: str
    fn: str | None
    span: Span
    type: str
    kind: ValueKind
    axis: str | None = None
    bytes: sympy.Expr | None = None  # the whole value's; a model's params and buffers on one device
    per_example: sympy.Expr | None = None  # a split value's bytes per example
    sharded: bool = False  # a model, optimizer or gradients each device holds parts of (`shard params`, `split H`)
    buffers: sympy.Expr | None = None  # such a model's buffers, whole on each device
    split_params: tuple[str, ...] = ()  # such a model's (its gradients', its optimizer's) params split along H
    state: str | None = None  # an optimizer's: what it keeps per param value ("two moments")

    @property
    def bytes_text(self) -> str | None:
        """`bytes` as `shapescript comms` writes it (`16·n bytes`); None where the size isn't known."""
        return bytes_text(self.bytes) if self.bytes is not None else None

    @property
    def per_example_text(self) -> str | None:
        return bytes_text(self.per_example) if self.per_example is not None else None


@dataclass(frozen=True)
class FnPlan(_Sized):
    name: str
    span: Span
    placement: Where
    reason: str
    sent: tuple[Sent, ...]  # one call's collectives, its calls included
    differentiated: bool  # value_and_grad differentiates it somewhere
    sent_differentiated: tuple[Sent, ...]  # the same under value_and_grad

    @property
    def bytes(self) -> sympy.Expr:
        return sympy.Add(*(s.bytes for s in self.sent))
