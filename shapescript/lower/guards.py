"""Lowering of types to the runtime's guards: for values that come in from Python (a function's
arguments, and the results of python and extern fns, whose checks the built module prints)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import sympy
import torch

from ..check import dims as D
from ..check import types as T
from ..check.program import Checked, FnInfo
from ..runtime import guards as G
from .specs import TORCH_DTYPES
from .text import literal

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


def _compute(c: Checked, size: D.Dim) -> G.DimFormula | None:
    fixed = {s: c.dim_values[s.name] for s in size.free_symbols
             if not D.is_generic(s) and c.dim_values.get(s.name) is not None}
    try:
        return G.DimFormula(_formula(sympy.sympify(size.xreplace(fixed))))
    except ValueError:
        return None  # not arithmetic the runtime evaluates: that axis is left unchecked


def _formula(expr: sympy.Expr) -> Any:
    """A dim expression as DimFormula's tree (+ - * / of dims give sums, products and powers)."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Rational:
        return ("/", int(expr.p), int(expr.q))
    if expr.is_Symbol:
        return expr.name
    if expr.is_Add or expr.is_Mul:
        return ("+" if expr.is_Add else "*",) + tuple(_formula(a) for a in expr.args)
    if expr.is_Pow and expr.exp.is_Integer:
        return ("**", _formula(expr.base), int(expr.exp))
    raise ValueError(f"no formula for {expr}")


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


def result_check(c: Checked, fn: FnInfo) -> G.ResultGuard | None:
    """A check of a `python` or `extern` fn's result against its declared type (None: nothing to
    check). The built module prints it (`source`), so it runs wherever the module runs."""
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
    return G.ResultGuard(guard, _arg_dims(c, fn) if isinstance(t, T.TensorT) else ())


def _arg_dims(c: Checked, fn: FnInfo) -> tuple[G.ArgDims | None, ...]:
    """What each parameter of `fn` binds of the generic dims, for its result's check (trailing
    parameters that bind none are left out)."""
    out: list[G.ArgDims | None] = []
    for p in fn.params:
        param = G.Param(fn.name, p.name, str(p.node.span))
        if isinstance(p.ty, T.TensorT) and any(D.is_generic(a.size) for a in p.ty.axes):
            out.append(G.ArgDims(param, axis_checks(c, p.ty.axes)))
        elif isinstance(p.ty, T.BatchT) and any(D.is_generic(a.size) for a in p.ty.axes):
            out.append(G.ArgDims(param, axis_checks(c, p.ty.axes), batch=True))
        else:
            out.append(None)
    while out and out[-1] is None:
        out.pop()
    return tuple(out)


def source(value: Any) -> str:
    """Python source that rebuilds a guard in the built module: runtime.guards' dataclasses as
    `_rt.` calls (fields left at their defaults are left out), dtypes, and literals for the rest."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f for f in dataclasses.fields(value) if getattr(value, f.name) != f.default]
        args = ", ".join(f"{f.name}={source(getattr(value, f.name))}" for f in fields)
        return f"_rt.{type(value).__name__}({args})"
    if isinstance(value, torch.dtype):
        return f"torch.{str(value).split('.')[1]}"
    if isinstance(value, tuple):
        items = [source(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return literal(value)
