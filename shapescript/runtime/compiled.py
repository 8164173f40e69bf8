"""Compiled steps (`ss.load(..., compiled=True)`): each pure function on the devices handed to
`torch.compile`, with the shapes its types give.

A function is compiled when it works on its arguments alone: no `mut` parameter (an update runs
eagerly, as a fused optimizer does beside a compiled model), no Python of the program's own (`extern`
or `python fn`: code the tracer shouldn't see). The others run as built, calling the compiled ones,
so a `train_step` is its loss's forward and backward compiled (`value_and_grad` of a compiled
function) and its optimizer's update eager.

Each axis whose size the types leave generic (the batch's `b`, a padded length) is marked dynamic
before the call, and every declared dim is a fixed size: one graph serves every batch size, with
no recompile when the last batch of a pass is smaller. Gradients are traced (`value_and_grad` inside a
compiled function stays in its graph). The first call of each compiled function compiles it: its
time is kept in `CompiledFunction.compile_seconds` (the program's `compile_report()`), and
inductor's own cache keeps the kernels across runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._dynamo

from .data import Batch, batch_fields
from .guards import BatchGuard, TensorGuard


class CompiledFunction:
    """A program's function as torch.compile runs it, its generic axes marked dynamic at each call."""

    def __init__(self, fn: Callable[..., Any], guards: Sequence[Any], backend: str) -> None:
        self.__name__ = fn.__name__
        self.original = fn
        self.dynamic = tuple(_dynamic_axes(g) for g in guards)  # per parameter: which axes vary
        self.compiled = torch.compile(fn, backend=backend, dynamic=False)
        self.compile_seconds: float | None = None

    def __call__(self, *args: Any) -> Any:
        if torch.compiler.is_compiling():  # called by another compiled function: part of its graph
            return self.original(*args)
        for value, axes in zip(args, self.dynamic):
            if axes:
                _mark(value, axes)
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            if self.compile_seconds is not None:
                return self.compiled(*args)
            start = time.perf_counter()
            result = self.compiled(*args)
            self.compile_seconds = time.perf_counter() - start  # the first call: compiling, and one run
            return result


def _dynamic_axes(guard: Any) -> tuple[int, ...]:
    """The axes of a parameter whose sizes its type leaves generic (a batch: its own axes, the
    fields' leading ones)."""
    if isinstance(guard, TensorGuard):
        return tuple(k for k, a in enumerate(guard.axes) if a.size is None)
    if isinstance(guard, BatchGuard):
        return tuple(range(len(guard.axes)))
    return ()


def _mark(value: Any, axes: tuple[int, ...]) -> None:
    tensors = batch_fields(value).values() if isinstance(value, Batch) else [value]
    for t in tensors:
        if isinstance(t, torch.Tensor):
            torch._dynamo.maybe_mark_dynamic(t, [k for k in axes if k < t.dim()])


def compile_functions(namespace: dict[str, Any], names: dict[str, str], backend: str) -> dict[str, CompiledFunction]:
    """Replace each function of `names` (its .ss name -> its Python name in the module) by its
    compiled self, where the module's own calls find it."""
    out = {}
    for ss_name, py in names.items():
        compiled = CompiledFunction(namespace[py], namespace["GUARDS"].get(ss_name, ()), backend)
        namespace[py] = out[ss_name] = compiled
    return out
