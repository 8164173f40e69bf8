"""The checker's types. A tensor type is its axes (sympy dims, a group axis remembering its parts),
its dtype, and for `Index[C]` the bound its values lie under."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..dtypes import FLOAT_DTYPES, INT_DTYPES
from ..optimizers import OptimizerKind
from ..syntax import tree as A
from . import dims as D


class Ty:
    def show(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class AxisT:
    size: D.Dim
    parts: tuple[D.Dim, ...] | None = None  # a group axis `(H Dh)`

    def show(self) -> str:
        if self.parts:
            return "(" + " ".join(D.show(p) for p in self.parts) + ")"
        return D.show(self.size)

    def same(self, other: AxisT, derived: D.Definitions | None = None) -> bool:
        """One size (`derived`: the program's derived dims, for a stage after the checker)."""
        return D.equal(self.size, other.size, derived)

    def subs(self, mapping: Mapping[D.Dim, D.Dim]) -> AxisT:
        if not mapping:
            return self
        parts = tuple(D.substitute(p, mapping) for p in self.parts) if self.parts else None
        return AxisT(D.substitute(self.size, mapping), parts)


def axis(size: D.Dim) -> AxisT:
    return AxisT(size)


def group(parts: tuple[D.Dim, ...]) -> AxisT:
    size = parts[0]
    for p in parts[1:]:
        size = size * p
    return AxisT(size, parts)


def show_axes(axes: tuple[AxisT, ...]) -> str:
    return "[" + " ".join(a.show() for a in axes) + "]"


@dataclass(frozen=True)
class TensorT(Ty):
    axes: tuple[AxisT, ...]
    dtype: str = "f32"
    index: D.Dim | None = None  # Index[C]: every value in 0..C

    def show(self) -> str:
        text = show_axes(self.axes)
        if self.index is not None:
            return f"{text} Index[{D.show(self.index)}]"
        return text if self.dtype == "f32" else f"{text} {self.dtype}"

    @property
    def rank(self) -> int:
        return len(self.axes)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def with_axes(self, axes: tuple[AxisT, ...]) -> TensorT:
        return TensorT(tuple(axes), self.dtype, self.index)

    def subs(self, mapping: Mapping[D.Dim, D.Dim]) -> TensorT:
        if not mapping:
            return self
        index = D.substitute(self.index, mapping) if self.index is not None else None
        return TensorT(tuple(a.subs(mapping) for a in self.axes), self.dtype, index)


@dataclass(eq=False)
class DataT(Ty):
    name: str
    node: A.Data
    fields: dict[str, TensorT] = field(default_factory=dict)
    field_nodes: dict[str, A.Field] = field(default_factory=dict)
    # Generic dims of the fields (`tokens: [n]`): padded per batch to its longest item.
    generics: dict[str, D.Dim] = field(default_factory=dict)

    def show(self) -> str:
        return self.name


@dataclass(frozen=True)
class BatchT(Ty):
    """`[b] Digit`: each field gains the batch axes in front."""
    axes: tuple[AxisT, ...]
    data: DataT
    # The data type's generic dims as this batch has them: each batch pads to its own longest item,
    # so each value of a batch type gets dims of its own, by the data's dims' names.
    padded: tuple[tuple[str, D.Dim], ...] = ()

    def show(self) -> str:
        return f"{show_axes(self.axes)} {self.data.name}"

    def field(self, name: str) -> TensorT:
        t = self.data.fields[name]
        if self.padded:
            own = dict(self.padded)
            t = t.subs({g: own[n] for n, g in self.data.generics.items() if n in own})
        return t.with_axes(self.axes + t.axes)

    def subs(self, mapping: Mapping[D.Dim, D.Dim]) -> BatchT:
        padded = tuple((n, D.substitute(d, mapping)) for n, d in self.padded)
        return BatchT(tuple(a.subs(mapping) for a in self.axes), self.data, padded)


@dataclass(eq=False)
class MemberT:
    kind: A.MemberKind
    name: str
    node: A.Member
    tensor: TensorT | None = None
    model: ModelT | None = None
    count: D.Dim | None = None  # a stack of `count` sub-models
    init: str = ""
    init_args: dict[str, float] = field(default_factory=dict)


@dataclass(eq=False)
class ModelT(Ty):
    """A model type: one declared with fixed sizes (`model Mlp:`), a generic one (`model Linear[I O]:`,
    its `params`; its members' types have those dims, and it is only used with dims given), or one
    use of a generic one with its dims (`Linear[D C]`: `of` and `args`), sized or generic itself."""
    name: str
    node: A.Model
    members: dict[str, MemberT] = field(default_factory=dict)
    params: tuple[str, ...] = ()
    dtype_params: frozenset[str] = frozenset()  # those of `params` written as a dtype (`[I O] T`)
    of: ModelT | None = None
    args: tuple[D.Dim, ...] = ()  # the dims given, in the order of the model's dims
    dtypes: tuple[str, ...] = ()  # the dtypes given, in the order of its dtype params

    def show(self) -> str:
        return self.name

    @property
    def family(self) -> str:
        """The declared model's name: `Linear` for `Linear[D C]`."""
        return self.of.name if self.of is not None else self.name

    @property
    def sized(self) -> bool:
        """Whether its members' shapes are fixed (given the declared dims): no generic dims in it."""
        return not self.params and not any(D.is_generic(s) for a in self.args for s in D.symbols(a))


@dataclass(frozen=True)
class AxisArgT(Ty):
    """`over: Axis[D]`, a parameter of an extern fn: the axis it works along, passed as its index."""
    dim: D.Dim

    def show(self) -> str:
        return f"Axis[{D.show(self.dim)}]"


@dataclass(frozen=True)
class StackT(Ty):
    """`blocks: [L] Block`: L models of one type, used one after another in a loop."""
    count: D.Dim
    model: ModelT

    def show(self) -> str:
        return f"[{D.show(self.count)}] {self.model.name}"


@dataclass(frozen=True)
class OptT(Ty):
    kind: OptimizerKind
    model: ModelT

    def show(self) -> str:
        return f"{self.kind}[{self.model.name}]"


@dataclass(frozen=True)
class GradT(Ty):
    model: ModelT

    def show(self) -> str:
        return f"Grad[{self.model.name}]"


@dataclass(frozen=True)
class DatasetT(Ty):
    data: DataT

    def show(self) -> str:
        return f"Dataset[{self.data.name}]"


@dataclass(frozen=True)
class BatchesT(Ty):
    """What `batches(n)` gives: an iterable of `[b] T` with a fresh `b` per loop."""
    data: DataT
    size: int | float | None  # the literal size, if given (a float one is an error, E0401)

    def show(self) -> str:
        return f"Batches[{self.data.name}]"


@dataclass(frozen=True)
class RangeT(Ty):
    """A counted loop's whole numbers (ops/loops.py): `count` of them where the checker knows how
    many (literals and dims), None where only the run does (an int parameter)."""
    count: D.Dim | None

    def show(self) -> str:
        return "Range" if self.count is None else f"Range[{D.show(self.count)}]"


@dataclass(frozen=True)
class ScalarT(Ty):
    """A plain value of the controller: int, float, bool or str (literals, Python results)."""
    kind: str

    def show(self) -> str:
        return self.kind


@dataclass(frozen=True)
class NamedT(Ty):
    """Opaque controller values: Sink, Logs, Mode."""
    name: str

    def show(self) -> str:
        return self.name


@dataclass(frozen=True)
class TupleT(Ty):
    items: tuple[Ty, ...]

    def show(self) -> str:
        return "(" + ", ".join(t.show() for t in self.items) + ")"


@dataclass(frozen=True)
class NoneT(Ty):
    def show(self) -> str:
        return "nothing"


@dataclass(frozen=True)
class FnRefT(Ty):
    name: str

    def show(self) -> str:
        return f"fn {self.name}"


@dataclass(frozen=True)
class UnknownT(Ty):
    """The type of an expression that already has an error: it silences follow-on errors."""

    def show(self) -> str:
        return "?"


UNKNOWN = UnknownT()
NONE = NoneT()
INT = ScalarT("int")
FLOAT = ScalarT("float")
MODE = NamedT("Mode")  # Train(seed=...) or Eval
BOOL = ScalarT("bool")
STR = ScalarT("str")
SINK = NamedT("Sink")
LOGS = NamedT("Logs")


def scalar_tensor(dtype: str = "f32") -> TensorT:
    return TensorT((), dtype)


def dims_note(t: Ty, values: Mapping[str, int | None]) -> str:
    """`with D = 784, C = 10`: the declared dims in a tensor type with their sizes, to say what
    sizes it means (in a diagnostic, and in the guards' run-time errors)."""
    if not isinstance(t, TensorT):
        return ""
    seen: dict[str, int] = {}
    for a in t.axes:
        for s in sorted(D.symbols(a.size), key=lambda s: s.name):
            v = values.get(s.name)
            if v is not None and not D.is_generic(s):
                seen[s.name] = v
    return (" with " + ", ".join(f"{k} = {v}" for k, v in seen.items())) if seen else ""


# How torch promotes a tensor's dtype with a plain number (by its kind: bool, int, float).
CATEGORY = {"bool": 0, "int": 1, "float": 2}
DEFAULT_DTYPE = {1: "i64", 2: "f32"}


def promoted(dtype: str, number: str, op: str) -> str:
    """The dtype torch gives `tensor op number` (either order) for an arithmetic `op`, as
    torch.result_type does: `/` is true division, so integers and bools give f32."""
    tensor_category = 2 if dtype in FLOAT_DTYPES else 1 if dtype in INT_DTYPES else 0
    if op == "/" and tensor_category < 2:
        return "f32"
    if CATEGORY[number] > tensor_category:
        return DEFAULT_DTYPE[CATEGORY[number]]
    return dtype


def same_type(a: Ty, b: Ty) -> bool:
    """The same type, dims compared as dims (an unknown type agrees with anything: it was reported)."""
    if a is UNKNOWN or b is UNKNOWN:
        return True
    if isinstance(a, TensorT) and isinstance(b, TensorT):
        return (a.rank == b.rank and all(x.same(y) for x, y in zip(a.axes, b.axes)) and a.dtype == b.dtype
                and _same_bound(a.index, b.index))
    return a == b


def _same_bound(a: D.Dim | None, b: D.Dim | None) -> bool:
    """Two `Index` bounds (None: no bound) are the same."""
    if a is None or b is None:
        return a is None and b is None
    return D.equal(a, b)
