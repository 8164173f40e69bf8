"""Debug checks that the checker's types are what runs (`generate(..., check_types=True)`,
`ss.load(..., check_types=True)`).

Every value of tensor, number or tuple type that the generated code computes is passed through
`expect` with the type the checker gave its expression, written as plain data (a "spec"):

    ("tensor", shown, axes, dtype, index)  shown: the type, as "[b C] f32" or "[b] Index[C]";
                                           axes: (label, want) per axis, want being
                                             an int      a fixed size (a declared dim, a literal),
                                             a str       a generic dim's key: bound on first sight
                                                         in the function's call, equal afterwards,
                                             a tuple     a DimFormula tree over generic keys: checked
                                                         once every key in it is bound,
                                             None        not checked;
                                           dtype: the .ss dtype ("f32"); index: None or
                                           (label, want) of an `Index[C]` bound
    ("scalar", kind)                       kind: int | float | bool | str
    ("tuple", items)                       items: a spec or None per item
    ("batch", fields)                      fields: (name, tensor spec) per field of a batch

A function call's frame (`Frame`, one per call of a generated function) holds the generic dims'
sizes. A value that differs raises ShapeError naming the .ss location and the expression; such a
difference is a hole in the checker, never a mistake of the program.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from shapescript.errors import ShapeError
from shapescript.runtime.guards import DimFormula
from shapescript.runtime.model import dtype_name, shape_text

Spec = tuple
Where = tuple[str, str]  # (.ss location, the expression's text)

_SCALAR_CHECKS = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, float),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
}


class Frame(dict):
    """One call's generic dims: key -> (size, the .ss location that bound it)."""

    def sizes(self) -> dict[str, int]:
        return {k: size for k, (size, _) in self.items()}


def expect(value: Any, spec: Spec, where: Where, frame: Frame) -> Any:
    """`value`, after checking that it is of the type `spec` describes; ShapeError where it isn't."""
    problem = _problem(value, spec, where, frame)
    if problem:
        location, text = where
        raise ShapeError(f"{location}: `{text}` {problem} (the checker's type differs from what runs: "
                         f"a bug of ShapeScript's checker)")
    return value


def each(items: Iterable[Any], keys: tuple[str, ...], frame: Frame) -> Iterator[Any]:
    """A loop's items, with the generic dims each item has afresh (a loop's batch axis, the lengths
    a batch pads to) forgotten before each: the last batch may be smaller."""
    for item in items:
        for key in keys:
            frame.pop(key, None)
        yield item


def _problem(value: Any, spec: Spec, where: Where, frame: Frame) -> str:
    kind = spec[0]
    if kind == "tensor":
        return _tensor_problem(value, spec, where, frame)
    if kind == "scalar":
        return "" if _SCALAR_CHECKS[spec[1]](value) else \
            f"is {_describe(value)} at run time, not {'an' if spec[1] == 'int' else 'a'} {spec[1]}"
    if kind == "tuple":
        items = spec[1]
        if not isinstance(value, tuple) or len(value) != len(items):
            return f"is {_describe(value)} at run time, not a tuple of {len(items)}"
        for k, (item, item_spec) in enumerate(zip(value, items)):
            problem = _problem(item, item_spec, where, frame) if item_spec is not None else ""
            if problem:
                return f"item {k + 1} {problem}"
        return ""
    if kind == "batch":
        for name, field_spec in spec[1]:
            problem = _tensor_problem(getattr(value, name, None), field_spec, where, frame)
            if problem:
                return f"field `{name}` {problem}"
        return ""
    raise ValueError(f"unknown type spec {spec!r}")


def _tensor_problem(value: Any, spec: Spec, where: Where, frame: Frame) -> str:
    _, shown, axes, dtype, index = spec
    if not isinstance(value, torch.Tensor):
        return f"is {_describe(value)} at run time, not a tensor {shown}"
    got = f"{shape_text(value.shape)} {dtype_name(value.dtype)}"
    if value.dim() != len(axes) or dtype_name(value.dtype) != dtype:
        return f"is {got} at run time, but its type is {shown}"
    for (_, want), size in zip(axes, value.shape):  # bare generics seen for the first time are bound
        if isinstance(want, str) and want not in frame:
            frame[want] = (int(size), where[0])
    sizes = frame.sizes()
    for k, ((label, want), size) in enumerate(zip(axes, value.shape)):
        expected = _size(want, sizes)
        if expected is not None and expected != size:
            return (f"is {got} at run time, but its type is {shown}: dim {k} is {size}, "
                    f"not {label} = {expected}{_bound_note(want, frame)}")
    if index is not None and value.numel():
        label, want = index
        bound = _size(want, sizes)
        low, high = int(value.min()), int(value.max())
        if bound is not None and (low < 0 or high >= bound):
            return f"holds {low if low < 0 else high}, outside its type's Index[{label}] with {label} = {bound}"
    return ""


def _size(want: Any, sizes: dict[str, int]) -> int | None:
    if isinstance(want, int) or want is None:
        return want
    if isinstance(want, str):
        return sizes.get(want)
    return DimFormula(want)(sizes)


def _bound_note(want: Any, frame: Frame) -> str:
    if isinstance(want, str) and want in frame:
        return f", bound by the value at {frame[want][1]}"
    return ""


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor {shape_text(value.shape)} {dtype_name(value.dtype)}"
    return f"a {type(value).__name__} {value!r}" if isinstance(value, (int, float, bool, str)) else \
        f"a {type(value).__name__}"
