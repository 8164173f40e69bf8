"""The guards of values that come in from Python, printed into the built module: each function's
arguments (`GUARDS`, which the caller's side runs before a call) and the results of python and
extern fns (`PYTHON_RESULTS`, which the module's own calls run). They are runtime/guards.py's
classes, printed as `_rt.` calls with plain data, so that they run wherever the module runs and
lowering builds no runtime object.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

import sympy

from ..ir import nodes as ir
from ..names import spec_var
from ..shapes import dims as D
from ..shapes import value_types as T
from .specs import TORCH_DTYPES
from .text import literal


@dataclass(frozen=True)
class Code:
    """Python text the module prints as it is: only ever made here, of names the module defines
    (a data spec's variable, a torch dtype, the module's DEVICE), never of user text."""
    text: str


@dataclass(frozen=True)
class RtCall:
    """A runtime class built in the module: `_rt.Name(field=value, ...)`."""
    name: str
    fields: tuple[tuple[str, Any], ...]


def rt(cls: str, /, **fields: Any) -> RtCall:
    """`_rt.cls(field=value, ...)`; fields given as None or False are left at their defaults."""
    return RtCall(cls, tuple((k, v) for k, v in fields.items() if not (v is None or v is False)))


def source(value: Any) -> str:
    """The Python source of a guard: RtCalls, Code, tuples, and literals for the rest."""
    if isinstance(value, RtCall):
        return f"_rt.{value.name}({', '.join(f'{k}={source(v)}' for k, v in value.fields)})"
    if isinstance(value, Code):
        return value.text
    if isinstance(value, tuple):
        items = [source(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return literal(value)


def axis_checks(c: ir.Module, axes: tuple[T.AxisT, ...]) -> tuple[RtCall, ...]:
    out = []
    for a in axes:
        size = D.value(a.size, c.dims)
        if size is not None:
            out.append(rt("AxisCheck", label=a.show(), size=size))
        elif isinstance(a.size, sympy.Dummy):
            out.append(rt("AxisCheck", label=a.show(), generic=a.size.name))
        else:
            out.append(rt("AxisCheck", label=a.show(), compute=_compute(c, a.size)))
    return tuple(out)


def _compute(c: ir.Module, size: D.Dim) -> RtCall | None:
    fixed = {s: c.dims[s.name] for s in D.symbols(size)
             if not D.is_generic(s) and c.dims.get(s.name) is not None}
    try:
        return rt("DimFormula", tree=formula(sympy.sympify(size.xreplace(fixed))))
    except ValueError:
        return None  # not arithmetic the runtime evaluates: that axis is left unchecked


# DimFormula's tree: a number, a dim's key, or (operator, operands...) with `/` and `**` of numbers
Formula: TypeAlias = int | str | tuple["Formula", ...]


def formula(expr: sympy.Basic) -> Formula:
    """A dim expression as DimFormula's tree (+ - * / of dims give sums, products and powers)."""
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Rational):
        return ("/", int(expr.p), int(expr.q))
    if isinstance(expr, sympy.Symbol):
        return expr.name
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        return ("+" if isinstance(expr, sympy.Add) else "*",) + tuple(formula(a) for a in expr.args)
    if isinstance(expr, sympy.Pow) and isinstance(expr.exp, sympy.Integer):
        return ("**", formula(expr.base), int(expr.exp))
    raise ValueError(f"no formula for {expr}")


def param_guard(c: ir.Module, fn: ir.Function, index: int) -> RtCall:
    """The guard of `fn`'s parameter `index`, for a value passed from Python."""
    device = Code("torch.device(DEVICE)") if c.devices.kind == "cuda" and c.devices.count == 1 else None
    p = fn.params[index]
    param = rt("Param", fn=fn.name, name=p.name, where=str(p.span))
    t = p.ty
    if isinstance(t, T.TensorT):
        return rt("TensorGuard", param=param, type_text=t.show(), dims_note=T.dims_note(t, c.dims),
                  axes=axis_checks(c, t.axes), dtype=Code(TORCH_DTYPES[t.dtype]),
                  index_bound=D.value(t.index, c.dims) if t.index is not None else None,
                  bound_label=D.show(t.index) if t.index is not None else None, device=device)
    if isinstance(t, T.BatchT):
        padded = []
        for name, dim in t.padded:
            holder = next((f, k) for f, ft in t.data.fields.items() for k, a in enumerate(ft.axes)
                          if a.size == t.data.generics[name])
            assert isinstance(dim, sympy.Dummy)  # a batch's own padded length: generic
            padded.append((rt("AxisCheck", label=name, generic=dim.name), holder[0], 1 + holder[1]))
        return rt("BatchGuard", param=param, spec=Code(spec_var(t.data.name)), axes=axis_checks(c, t.axes),
                  device=device, padded=tuple(padded) or None)
    kind = _kind(t)
    if kind is not None:
        model = t if isinstance(t, T.ModelT) else t.model if isinstance(t, T.OptT) else None
        generic = model is not None and not model.sized
        return rt("KindGuard", param=param, kind=kind[0], type_name=kind[1],
                  model=model.name if model is not None and not generic else None,
                  optimizer=t.kind.value if isinstance(t, T.OptT) else None,
                  family=model.family if model is not None and generic else None,
                  shapes=tuple(member_shapes(c, model)) if model is not None and generic else None)
    return rt("NotFromPython", param=param, type_text=t.show())


def member_shapes(c: ir.Module, model: T.ModelT, prefix: str = "") -> Iterator[tuple[str, tuple[RtCall, ...], Code]]:
    """Each param and buffer of a model type by its dotted path, with its axes as a guard checks them
    and its dtype (the first model of a stack stands for all)."""
    for m in model.members.values():
        if m.model is not None:
            yield from member_shapes(c, m.model, f"{prefix}{m.name}.")
        elif m.tensor is not None:
            yield f"{prefix}{m.name}", axis_checks(c, m.tensor.axes), Code(TORCH_DTYPES[m.tensor.dtype])


def _kind(t: T.Ty) -> tuple[str, str] | None:
    """A KindGuard's kind and the type's name in its message, for the types checked by kind."""
    if isinstance(t, T.ModelT):
        return "model", t.name
    if isinstance(t, T.OptT):
        return "optimizer", t.show()
    if isinstance(t, T.DatasetT):
        return "dataset", t.show()
    if t == T.SINK:
        return "sink", "a Sink"
    if t == T.NamedT("Mode"):
        return "mode", "a mode, ss.Train(seed=...) or ss.Eval"
    if isinstance(t, T.ScalarT):
        return t.kind, t.kind
    if isinstance(t, T.AxisArgT):  # from Python, an axis is its index
        return "int", "an axis index (int)"
    return None


def result_check(c: ir.Module, fn: ir.Function) -> RtCall | None:
    """A check of a `python` or `extern` fn's result against its declared type (None: nothing to
    check). The built module prints it (`source`), so it runs wherever the module runs."""
    t = fn.ret
    if t == T.NONE or t is T.UNKNOWN or not (isinstance(t, (T.TensorT, T.DatasetT, T.ScalarT)) or t == T.SINK):
        return None
    param = rt("Param", fn=fn.name, name="result", where=str(fn.span))
    if isinstance(t, T.TensorT):
        guard = rt("TensorGuard", param=param, type_text=t.show(), dims_note=T.dims_note(t, c.dims),
                   axes=axis_checks(c, t.axes), dtype=Code(TORCH_DTYPES[t.dtype]))
        return rt("ResultGuard", result=guard, args=_arg_dims(c, fn) or None)
    kind = _kind(t)
    assert kind is not None
    return rt("ResultGuard", result=rt("KindGuard", param=param, kind=kind[0], type_name=kind[1]))


def _arg_dims(c: ir.Module, fn: ir.Function) -> tuple[RtCall | None, ...]:
    """What each parameter of `fn` binds of the generic dims, for its result's check (trailing
    parameters that bind none are left out)."""
    out: list[RtCall | None] = []
    for p in fn.params:
        param = rt("Param", fn=fn.name, name=p.name, where=str(p.span))
        if isinstance(p.ty, (T.TensorT, T.BatchT)) and any(D.is_generic(a.size) for a in p.ty.axes):
            out.append(rt("ArgDims", param=param, axes=axis_checks(c, p.ty.axes), batch=isinstance(p.ty, T.BatchT)))
        else:
            out.append(None)
    while out and out[-1] is None:
        out.pop()
    return tuple(out)
