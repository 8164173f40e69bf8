"""Lowering of parameter types to the runtime's guards, for values that come in from Python."""

from __future__ import annotations

from typing import Any, Callable

import sympy
import torch

from ..check import dims as D
from ..check import types as T
from ..check.program import Checked, FnInfo
from ..runtime import guards as G
from .specs import TORCH_DTYPES

Guard = Callable[[Any, G.Bindings], Any]


def axis_checks(c: Checked, axes: tuple[T.AxisT, ...]) -> tuple[G.AxisCheck, ...]:
    out = []
    for a in axes:
        size = D.value(a.size, c.dim_values)
        if size is not None:
            out.append(G.AxisCheck(a.show(), size=size))
        elif D.is_generic(a.size):
            out.append(G.AxisCheck(a.show(), generic=a.size.name))
        else:
            out.append(G.AxisCheck(a.show(), compute=_compute(c, a.size)))
    return tuple(out)


def _compute(c: Checked, size: D.Dim) -> Callable[[dict[str, int]], int | None]:
    fixed = {s: c.dim_values[s.name] for s in size.free_symbols
             if not D.is_generic(s) and c.dim_values.get(s.name) is not None}
    expr = size.xreplace(fixed)
    generics = {s.name: s for s in expr.free_symbols}

    def compute(values: dict[str, int]) -> int | None:
        if not all(n in values for n in generics):
            return None
        v = sympy.sympify(expr.xreplace({s: values[n] for n, s in generics.items()}))
        return int(v) if v.is_Integer else None

    return compute


def dims_note(c: Checked, t: T.TensorT) -> str:
    seen: dict[str, int] = {}
    for a in t.axes:
        for s in sorted(a.size.free_symbols, key=lambda s: s.name):
            if not D.is_generic(s) and c.dim_values.get(s.name) is not None:
                seen[s.name] = c.dim_values[s.name]  # type: ignore[assignment]
    return (" with " + ", ".join(f"{k} = {v}" for k, v in seen.items())) if seen else ""


def guard_for(c: Checked, fn: FnInfo, index: int, namespace: dict[str, Any]) -> Guard:
    """The guard of `fn`'s parameter `index`; `namespace` is the built module's, holding its data specs
    and the device its tensors live on."""
    device = torch.device(namespace["DEVICE"])
    on = None if device.type == "cpu" else device
    p = fn.params[index]
    param = G.Param(fn.name, p.name, str(p.node.span))
    t = p.ty
    if isinstance(t, T.TensorT):
        bound = D.value(t.index, c.dim_values) if t.index is not None else None
        return G.TensorGuard(param, t.show(), dims_note(c, t), axis_checks(c, t.axes),
                             getattr(torch, TORCH_DTYPES[t.dtype].split(".")[1]), bound,
                             D.show(t.index) if t.index is not None else None, on)
    if isinstance(t, T.BatchT):
        spec = namespace[f"{t.data.name}_spec"]
        padded = []
        for name, dim in t.padded:
            holder = next((f, k) for f, ft in t.data.fields.items() for k, a in enumerate(ft.axes)
                          if a.size == t.data.generics[name])
            padded.append((G.AxisCheck(name, generic=dim.name), holder[0], 1 + holder[1]))
        return G.BatchGuard(param, spec, axis_checks(c, t.axes), on, tuple(padded))
    if isinstance(t, T.ModelT):
        return G.KindGuard(param, "model", t.name, model=t.name)
    if isinstance(t, T.OptT):
        return G.KindGuard(param, "optimizer", t.show(), model=t.model.name, optimizer=t.kind)
    if isinstance(t, T.DatasetT):
        return G.KindGuard(param, "dataset", t.show())
    if t == T.SINK:
        return G.KindGuard(param, "sink", "a Sink")
    if t == T.NamedT("Mode"):
        return G.KindGuard(param, "mode", "a mode, ss.Train(seed=...) or ss.Eval")
    if isinstance(t, T.ScalarT):
        return G.KindGuard(param, t.kind, t.kind)
    if isinstance(t, T.AxisArgT):  # from Python, an axis is its index
        return G.KindGuard(param, "int", "an axis index (int)")
    raise ValueError(f"`{fn.name}`'s parameter `{p.name}` of type {t.show()} can't be passed from Python")


def result_check(c: Checked, fn: FnInfo) -> Callable[[Any], Any] | None:
    """A check of a `python fn`'s result against its declared type."""
    if fn.ret == T.NONE or fn.ret is T.UNKNOWN:
        return None
    t = fn.ret
    param = G.Param(fn.name, "result", str(fn.node.span))
    if isinstance(t, T.TensorT):
        guard: Guard = G.TensorGuard(param, t.show(), dims_note(c, t), axis_checks(c, t.axes),
                                     getattr(torch, TORCH_DTYPES[t.dtype].split(".")[1]))
    elif isinstance(t, T.DatasetT):
        guard = G.KindGuard(param, "dataset", t.show())
    elif t == T.SINK:
        guard = G.KindGuard(param, "sink", "a Sink")
    elif isinstance(t, T.ScalarT):
        guard = G.KindGuard(param, t.kind, t.kind)
    else:
        return None
    return lambda value: guard(value, {})
