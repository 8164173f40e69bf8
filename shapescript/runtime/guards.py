"""Checks of values that come in from Python, against a function's declared parameter types.

The checker proves every shape inside the program; what it can't see is what a Python caller
passes. Each parameter gets a guard that checks its argument and binds the generic dims it
carries, so that `expected [b D] with D = 784, got [32, 783]` names the parameter, its .ss
location, and which argument bound each generic dim.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from shapescript.errors import DomainError, ShapeError
from shapescript.runtime.data import (
    Batch,
    DataSpec,
    as_given,
    batch_from_python,
    dense_problem,
    given_batch,
    in_bounds,
    trusted_batch,
    wrong_dim,
)
from shapescript.runtime.model import Model, ModelSpec, SubSpec, dtype_name, shape_text
from shapescript.runtime.modes import Mode
from shapescript.runtime.optim import Optimizer
from shapescript.runtime.sinks import Sink

# A generic dim's binding during one call: its size and which argument gave it.
Bindings = dict[str, tuple[int, str]]


@dataclass(frozen=True)
class AxisCheck:
    label: str  # as written: "D", "b", "b*D"
    size: int | None = None  # a fixed size
    generic: str | None = None  # a bare generic dim, bound by the first argument that has it
    compute: Callable[[dict[str, int]], int | None] | None = None  # arithmetic over generic dims


@dataclass(frozen=True)
class DimFormula:
    """A size computed from generic dims, kept as plain data so that a built module can print it:
    an int, a dim's name, or (op, operand...) with op one of + * ** and ("/", p, q) for p/q."""
    tree: Any

    def __call__(self, values: dict[str, int]) -> int | None:
        """The size, or None while a dim it needs is unbound or if it isn't a whole number."""
        try:
            size = _evaluate(self.tree, values)
        except (KeyError, ZeroDivisionError):
            return None
        return int(size) if size.denominator == 1 else None


def _evaluate(tree: Any, values: dict[str, int]) -> Fraction:
    if isinstance(tree, int):
        return Fraction(tree)
    if isinstance(tree, str):
        return Fraction(values[tree])
    op, *args = tree
    if op == "/":
        return Fraction(args[0], args[1])
    if op == "**":
        return _evaluate(args[0], values) ** args[1]
    parts = [_evaluate(a, values) for a in args]
    return sum(parts, Fraction(0)) if op == "+" else math.prod(parts, start=Fraction(1))


@dataclass(frozen=True)
class Param:
    fn: str
    name: str
    where: str  # the parameter's declaration

    def __str__(self) -> str:
        return f"`{self.name}` of `{self.fn}` ({self.where})"


def _bind_generics(axes: tuple[AxisCheck, ...], shape: tuple[int, ...], bindings: Bindings, source: str) -> None:
    """Bind the bare generics not bound yet to their sizes in `shape`."""
    for a, n in zip(axes, shape):
        if a.generic is not None and a.generic not in bindings:
            bindings[a.generic] = (n, source)


def _bind(axes: tuple[AxisCheck, ...], shape: tuple[int, ...], bindings: Bindings, source: str
          ) -> tuple[int, int] | None:
    """Bind bare generics, then check every axis; the first bad axis's index and the size it should
    have, or None."""
    _bind_generics(axes, shape, bindings, source)
    for k, (a, n) in enumerate(zip(axes, shape)):
        want = a.size if a.size is not None else bindings[a.generic][0] if a.generic else (
            a.compute({g: v for g, (v, _) in bindings.items()}) if a.compute else None)
        if want is not None and want != n:
            return k, want
    return None


def _explain(axes: tuple[AxisCheck, ...], bindings: Bindings, source: str) -> str:
    """`; b was bound to 32 by `x`` for the generics an earlier argument fixed."""
    notes = []
    for a in axes:
        if a.generic and a.generic in bindings and bindings[a.generic][1] != source:
            size, by = bindings[a.generic]
            notes.append(f"{a.generic} was bound to {size} by {by}")
    return ("; " + "; ".join(notes)) if notes else ""


@dataclass(frozen=True)
class TensorGuard:
    param: Param
    type_text: str  # "[b D]"
    dims_note: str  # " with D = 784"
    axes: tuple[AxisCheck, ...]
    dtype: torch.dtype
    index_bound: int | None = None
    bound_label: str | None = None
    device: torch.device | None = None  # where the program's tensors live, if not the CPU

    def __call__(self, value: Any, bindings: Bindings) -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            if isinstance(value, numbers.Number) and not self.axes and not isinstance(value, bool):
                value = torch.tensor(value, dtype=self.dtype)
            else:
                raise ShapeError(f"{self.param} must be a torch tensor {self.type_text}{self.dims_note}, "
                                 f"not {type(value).__name__}")
        unusable = dense_problem(value)
        if unusable:
            raise ShapeError(f"{self.param} must be a tensor with its values, but it is {unusable}")
        expected = f"{self.type_text}{self.dims_note}"
        if value.dim() != len(self.axes):
            raise ShapeError(f"{self.param}: expected {expected}, got shape {shape_text(value.shape)}")
        if value.dtype != self.dtype:
            raise ShapeError(f"{self.param}: expected dtype {dtype_name(self.dtype)}, got "
                             f"{dtype_name(value.dtype)}; convert it with .to({self.dtype})")
        bad = _bind(self.axes, tuple(value.shape), bindings, f"`{self.param.name}`")
        if bad is not None:
            k, want = bad
            raise ShapeError(f"{self.param}: expected {expected}, got shape {shape_text(value.shape)}; "
                             f"{wrong_dim(k, value.shape[k], self.axes[k].label, want)}"
                             f"{_explain(self.axes, bindings, f'`{self.param.name}`')}")
        if self.index_bound is not None and value.numel():
            lo, hi = int(value.min()), int(value.max())
            if lo < 0 or hi >= self.index_bound:
                worst = lo if lo < 0 else hi
                raise DomainError(f"{self.param}: value {worst} is outside Index[{self.bound_label}] with "
                                  f"{self.bound_label} = {self.index_bound} (0 to {self.index_bound - 1})")
        if self.device is not None and value.device != self.device:
            value = value.to(self.device)
        return value

    def quick(self, v: str, out: QuickChecks, specs: Mapping[str, ModelSpec]) -> str | None:
        """A dense tensor of the dtype, shape and device, Index values in bounds: taken as it is."""
        if not _plain_axes(self.axes):
            return None
        out.require(f"type({v}) is _Tensor and {v}.dtype is {out.constant(self.dtype)} and {v}.layout is _strided "
                    f"and not {v}.is_meta and {v}.dim() == {len(self.axes)}")
        out.line(f"{v}_shape = {v}.shape")
        for k, a in enumerate(self.axes):
            out.axis(f"{v}_shape[{k}]", a)
        if self.device is not None:
            out.require(f"{v}.device == {out.constant(self.device)}")
        if self.index_bound is not None:
            out.require(f"in_bounds({v}, {int(self.index_bound)})")
        return v


@dataclass(frozen=True)
class BatchGuard:
    param: Param
    spec: DataSpec
    axes: tuple[AxisCheck, ...]  # the batch's own axes, as [b]
    device: torch.device | None = None
    # The data's generic dims (`n` of `tokens: [n]`) as the function names them, with the field and
    # axis that hold each: a function taking two batches sees whether their lengths agree.
    padded: tuple[tuple[AxisCheck, str, int], ...] = ()

    def __call__(self, value: Any, bindings: Bindings) -> Batch:
        if self.device is None and not self.padded:  # the short way of a right batch
            fields = as_given(self.spec, value, None)
            if fields:
                batch = trusted_batch(self.spec, fields)
                if batch.size and _bind(self.axes, (batch.size,), bindings, f"`{self.param.name}`") is None:
                    return batch
        batch = batch_from_python(self.spec, value, str(self.param))
        if self.device is not None:
            batch = trusted_batch(self.spec, {f.name: getattr(batch, f.name).to(self.device) for f in self.spec.fields})
        source = f"`{self.param.name}`"
        axes = self.axes + tuple(check for check, _, _ in self.padded)
        shape = (batch.size,) + tuple(getattr(batch, name).shape[k] for _, name, k in self.padded)
        bad = _bind(axes, shape, bindings, source)
        if bad is not None:
            k, want = bad
            label = axes[k].label
            # the batch's own axis is dim 0 of every field; a padded dim is a dim of one field
            if k < len(self.axes):
                held = "dim 0 of each field"
            else:
                _, field, dim = self.padded[k - len(self.axes)]
                held = f"dim {dim} of field `{field}`"
            should = f"{want} before" if axes[k].generic else f"{label} = {want}"
            raise ShapeError(f"{self.param}: {label} is {shape[k]} in this batch ({held}), but {should}"
                             f"{_explain(axes, bindings, source)}")
        return batch

    def quick(self, v: str, out: QuickChecks, specs: Mapping[str, ModelSpec]) -> str | None:
        """A dict that `as_given` takes as it is, with rows (on the device); or a Batch of this type."""
        if self.padded or self.spec.as_given is None or not _plain_axes(self.axes[:1]):
            return None
        spec, fields = out.constant(self.spec), self.spec.as_given
        out.line(f"if type({v}) is dict:")  # what data.py's `given_rows` checks, written out
        out.require(f"len({v}) == {len(fields)}", indent="    ")
        for k, (name, dtype, shape, bound) in enumerate(fields):
            t = f"{v}_f{k}"
            out.line(f"    {t} = {v}.get({out.constant(name)})")
            out.require(f"type({t}) is _Tensor and {t}.dtype is {out.constant(dtype)} and {t}.layout is _strided "
                        f"and not {t}.is_meta", indent="    ")
            if k == 0:
                out.line(f"    {v}_rows = {t}.shape[0] if {t}.dim() else -1")
            out.require(f"{t}.shape == ({v}_rows,{''.join(f' {int(n)},' for n in shape)})", indent="    ")
            if bound is not None:
                out.require(f"in_bounds({t}, {int(bound)})", indent="    ")
        out.require(f"{v}_rows > 0", indent="    ")
        if self.device is not None:
            out.require(f"all(t.device == {out.constant(self.device)} for t in {v}.values())", indent="    ")
        out.line(f"    {v}_batch = given_batch({spec}, {v}, {v}_rows)")
        if self.device is None:  # a Batch on another device is moved by the full check
            out.line(f"elif type({v}) is Batch and {v}.spec is {spec}:")
            out.line(f"    {v}_rows, {v}_batch = {v}.size, {v}")
        out.line("else: return None")
        for a in self.axes[:1]:  # a batch has one size: what `__call__` binds too
            out.axis(f"{v}_rows", a)
        return f"{v}_batch"


@dataclass(frozen=True)
class ArgDims:
    """A python or extern fn's parameter whose type carries generic dims: the axes of its tensor
    (or, for a batch, `[b]` of its size)."""
    param: Param
    axes: tuple[AxisCheck, ...]
    batch: bool = False


@dataclass(frozen=True)
class ResultGuard:
    """A python or extern fn's result check. The generic dims are bound from the arguments first,
    as the fn's type says: `add_noise(x: [n D]) -> [n D]` must return as many rows as `x` has."""
    result: Any  # a TensorGuard or KindGuard
    args: tuple[ArgDims | None, ...] = ()  # one per parameter; None where it binds no dim

    def __call__(self, value: Any, args: tuple) -> Any:
        bindings: Bindings = {}
        for dims, arg in zip(self.args, args):
            if dims is None:
                continue
            shape = (arg.size,) if dims.batch and isinstance(arg, Batch) else \
                tuple(arg.shape) if isinstance(arg, torch.Tensor) else None
            if shape is not None and len(shape) == len(dims.axes):  # else the fn's own check fails
                _bind_generics(dims.axes, shape, bindings, str(dims.param))
        return self.result(value, bindings)


@dataclass(frozen=True)
class NotFromPython:
    """A parameter of a type no Python value has (gradients, a model's stack): refused at the call."""
    param: Param
    type_text: str

    def __call__(self, value: Any, bindings: Bindings) -> Any:
        raise ValueError(f"`{self.param.fn}`'s parameter `{self.param.name}` of type {self.type_text} can't be "
                         f"passed from Python")

    def quick(self, v: str, out: QuickChecks, specs: Mapping[str, ModelSpec]) -> str | None:
        return None  # no call passes: the full check says why


@dataclass(frozen=True)
class KindGuard:
    """Models, optimizers, datasets, sinks and plain values: checked by kind and type name."""
    param: Param
    kind: str  # model | optimizer | dataset | sink | mode | int | float | bool | str
    type_name: str  # "Mlp", "AdamW[Mlp]", "Dataset[Digit]"...
    model: str | None = None
    optimizer: str | None = None
    # A use of a generic model with generic dims (`Linear[i o]`): any use of `family` whose params'
    # shapes (each a dotted path with its axes) bind the dims as the function's other arguments do
    family: str | None = None
    shapes: tuple[tuple[str, tuple[AxisCheck, ...], torch.dtype], ...] = ()

    def __call__(self, value: Any, bindings: Bindings) -> Any:
        if not _KIND_CHECKS[self.kind](self, value):
            raise ShapeError(f"{self.param} must be {self.type_name}, not {_describe(value)}")
        if self.family is not None:
            spec = value.spec if self.kind == "model" else value.model.spec
            for path, axes, dtype in self.shapes:
                shape, has = _member_shape(spec, path)
                if has != dtype:
                    raise ShapeError(f"{self.param}: {spec.name}'s `{path}` is {dtype_name(has)}, but "
                                     f"{self.type_name} needs {dtype_name(dtype)}")
                bad = _bind(axes, shape, bindings, f"`{self.param.name}.{path}`")
                if bad is not None:
                    k, want = bad
                    raise ShapeError(f"{self.param}: {spec.name}'s `{path}` has shape {shape_text(shape)}, but "
                                     f"{self.type_name} needs {wrong_dim(k, shape[k], axes[k].label, want)}"
                                     f"{_explain(axes, bindings, f'`{self.param.name}.{path}`')}")
        return value

    def quick(self, v: str, out: QuickChecks, specs: Mapping[str, ModelSpec]) -> str | None:
        """A model or optimizer passes at once only if its model has the very spec of `specs` (the
        program's own: what api.py's stale-model check passes at once too); other kinds as here.
        The workers' handles (`is_remote`) pass as `_is_model` and `_is_optimizer` pass them."""
        if self.family is not None:
            return None
        if self.kind == "model" or self.kind == "optimizer":
            spec = specs.get(self.model or "")
            if spec is None:
                return None
            if self.kind == "model":
                out.require(f"(isinstance({v}, Model) or getattr({v}, 'is_remote', False)) "
                            f"and {v}.spec is {out.constant(spec)}")
            else:
                out.require(f"(isinstance({v}, Optimizer) or getattr({v}, 'is_remote', False)) "
                            f"and {v}.kind == {out.constant(self.optimizer)} and {v}.model.spec is {out.constant(spec)}")
        else:
            out.require(f"{out.constant(_KIND_CHECKS[self.kind])}({out.constant(self)}, {v})")
        return v


def _is_model(g: KindGuard, v: Any) -> bool:
    return (isinstance(v, Model) or getattr(v, "is_remote", False)) and _of_type(g, v.spec)


def _is_optimizer(g: KindGuard, v: Any) -> bool:
    return ((isinstance(v, Optimizer) or getattr(v, "is_remote", False)) and v.kind == g.optimizer
            and _of_type(g, v.model.spec))


def _of_type(g: KindGuard, spec: ModelSpec) -> bool:
    return spec.family == g.family if g.family is not None else spec.name == g.model


def _member_shape(spec: ModelSpec, path: str) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype of the param or buffer at `path` ("attn.w") in a model of type `spec`."""
    head, _, rest = path.partition(".")
    member = next(m for m in spec.members if m.name == head)
    if isinstance(member, SubSpec):
        return _member_shape(member.model, rest)
    return member.shape, member.dtype


# One check per kind, looked up by the guard (a call is on the hot path of every step).
_KIND_CHECKS: dict[str, Callable[[KindGuard, Any], bool]] = {
    "model": _is_model,
    "optimizer": _is_optimizer,
    "dataset": lambda g, v: hasattr(v, "__len__") and hasattr(v, "__getitem__"),
    "sink": lambda g, v: isinstance(v, Sink) or callable(getattr(v, "write", None)),
    "mode": lambda g, v: isinstance(v, Mode),
    "int": lambda g, v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
    "float": lambda g, v: isinstance(v, numbers.Real) and not isinstance(v, bool),
    "bool": lambda g, v: isinstance(v, bool),
    "str": lambda g, v: isinstance(v, str),
}


def _describe(value: Any) -> str:
    if isinstance(value, Model):
        return f"a model of type {value.spec.name}"
    if isinstance(value, Optimizer):
        return f"an optimizer {value.kind}[{value.model.spec.name}]"
    if isinstance(value, torch.Tensor):
        return f"a tensor {shape_text(value.shape)} {dtype_name(value.dtype)}"
    return f"a {type(value).__name__}"


# -- a function's short way through its checks --------------------------------------------------

class QuickChecks:
    """The text of a function's short way through its argument checks (`signature_check`), as its
    guards write it: one condition after another, each argument's check read off its cached metadata.
    Only ever made of this module's own names, the guards' constants (by the names `constant` gives
    them) and ints; never of user text."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}
        self.dims: dict[str, str] = {}  # each generic dim's local name, once an argument has bound it

    def constant(self, value: Any) -> str:
        name = f"_c{len(self.constants)}"
        self.constants[name] = value
        return name

    def require(self, condition: str, indent: str = "") -> None:
        self.lines.append(f"    {indent}if not ({condition}): return None")

    def line(self, text: str) -> None:
        self.lines.append(f"    {text}")

    def axis(self, size: str, a: AxisCheck) -> None:
        """`size` (an expression) against one axis: a fixed size, or a generic dim, bound by the first
        argument that has it (known as the text is written: the arguments are checked in order)."""
        if a.size is not None:
            self.require(f"{size} == {int(a.size)}")
        elif a.generic is not None:
            if a.generic in self.dims:
                self.require(f"{size} == {self.dims[a.generic]}")
            else:
                self.dims[a.generic] = f"_d{len(self.dims)}"
                self.line(f"{self.dims[a.generic]} = {size}")


def _plain_axes(axes: tuple[AxisCheck, ...]) -> bool:
    """No axis computed from generic dims (those take the full check)."""
    return all(a.compute is None and (a.size is None or a.generic is None) for a in axes)


def signature_check(guards: Sequence[Any], specs: Mapping[str, ModelSpec]
                    ) -> Callable[[Sequence[Any]], list[Any] | None] | None:
    """A function's short way through its argument guards, written once: given the
    arguments in order, the values the guards would give, or None where any argument needs more than
    a look at cached metadata (then the guards themselves run, and word what is wrong). None where
    some guard has no quick check. `specs`: the program's model specs by name."""
    out = QuickChecks()
    names = [f"_v{k}" for k in range(len(guards))]
    results = [g.quick(v, out, specs) if hasattr(g, "quick") else None for g, v in zip(guards, names)]
    if any(r is None for r in results):
        return None
    unpack = [f"    {''.join(v + ', ' for v in names)}= values"] if names else []
    text = "\n".join(["def check(values):", *unpack, *out.lines,
                      f"    return [{', '.join(r for r in results if r is not None)}]", ""])
    scope = {**out.constants, "_Tensor": torch.Tensor, "_strided": torch.strided, "Model": Model,
             "Optimizer": Optimizer, "Batch": Batch, "given_batch": given_batch, "in_bounds": in_bounds}
    exec(compile(text, "<argument checks>", "exec"), scope)  # our own text: see QuickChecks
    check: Callable[[Sequence[Any]], list[Any] | None] = scope["check"]
    return check
