"""What a function of the program is, and what a call calls: facts the checker finds and every later
stage (placement, the batch split, lowering) reads. StrEnums: each reads and prints as its word."""

from __future__ import annotations

import enum


class FnKind(enum.StrEnum):
    """A function of the program: ShapeScript's own (`fn`), a `python fn` (Python, run in the
    controller) or an `extern fn` (Python on tensors, run where its caller runs)."""

    FN = "fn"
    PYTHON = "python"
    EXTERN = "extern"


class CallKind(enum.StrEnum):
    """What a call resolved to: an op of the op table (BUILTIN), a function of the program of each
    FnKind, or `value_and_grad` of a function (GRAD: resolved as a call of the function it
    differentiates)."""

    BUILTIN = "builtin"
    FN = "fn"
    PYTHON = "python"
    EXTERN = "extern"
    GRAD = "grad"
