"""The syntax tree. Every node has a span; later stages key their facts by node identity."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import Diagnostic, Span


@dataclass(eq=False)
class Node:
    span: Span


# ---- dims and types --------------------------------------------------------------------------

@dataclass(eq=False)
class DimName(Node):
    name: str


@dataclass(eq=False)
class DimInt(Node):
    value: int


@dataclass(eq=False)
class DimBin(Node):
    op: str  # + - * /
    left: DimExpr
    right: DimExpr


DimExpr = DimName | DimInt | DimBin


@dataclass(eq=False)
class GroupAxis(Node):
    """`(H Dh)`: one axis whose size is the product, remembered as its parts."""
    parts: list[DimExpr]


Axis = DimExpr | GroupAxis


@dataclass(eq=False)
class ShapeType(Node):
    """`[b D]`, `[b D] f16`, `[] Index[C]`, `[b] Digit`: a shape and what each element is."""
    axes: list[Axis]
    element: NamedType | None  # None: f32 tensor


@dataclass(eq=False)
class NamedType(Node):
    """`f16`, `Digit`, `AdamW[Mlp]`, `Dataset[Digit]`, `Index[C]`, `Axis[D]`, `Sink`."""
    name: str
    args: list[TypeExpr | DimExpr] = field(default_factory=list)


TypeExpr = ShapeType | NamedType


# ---- expressions ------------------------------------------------------------------------------

@dataclass(eq=False)
class Name(Node):
    id: str


@dataclass(eq=False)
class IntLit(Node):
    value: int


@dataclass(eq=False)
class FloatLit(Node):
    value: float


@dataclass(eq=False)
class StrLit(Node):
    value: str


@dataclass(eq=False)
class BoolLit(Node):
    value: bool


@dataclass(eq=False)
class Attr(Node):
    obj: Expr
    name: str
    name_span: Span


@dataclass(eq=False)
class Subscript(Node):
    obj: Expr
    index: Expr


@dataclass(eq=False)
class Binary(Node):
    op: str
    left: Expr
    right: Expr


@dataclass(eq=False)
class Unary(Node):
    op: str  # - not
    operand: Expr


@dataclass(eq=False)
class TupleExpr(Node):
    items: list[Expr]


@dataclass(eq=False)
class PatAxis(Node):
    """One axis of a pattern: a name, a literal size, or a group of them."""
    name: str | None = None
    size: int | None = None
    group: list[PatAxis] | None = None


@dataclass(eq=False)
class Pattern(Node):
    """`b n (3 H Dh) -> b H n Dh` as an argument of rearrange, split, reduce, repeat, einsum."""
    lhs: list[list[PatAxis]]  # einsum takes several operands: `b i, i j -> b j`
    rhs: list[PatAxis]


@dataclass(eq=False)
class Arg(Node):
    value: Expr | Pattern
    keyword: str | None = None
    mut: bool = False

    @property
    def expr(self) -> Expr:
        """The value where only an expression can be: the parser gives a pattern no keyword and no
        `mut`, and a call that takes no pattern refuses one before it reads its arguments."""
        assert not isinstance(self.value, Pattern), "a pattern where an expression was expected"
        return self.value


@dataclass(eq=False)
class Call(Node):
    func: Expr
    args: list[Arg]
    piped: bool = False  # `x |> f(y)`: the first arg came from the pipe


Expr = Name | IntLit | FloatLit | StrLit | BoolLit | Attr | Subscript | Binary | Unary | TupleExpr | Call


# ---- statements -------------------------------------------------------------------------------

@dataclass(eq=False)
class Assign(Node):
    targets: list[Name]
    value: Expr


@dataclass(eq=False)
class Return(Node):
    value: Expr | None


@dataclass(eq=False)
class For(Node):
    var: Name
    iter: Expr
    body: list[Stmt]


@dataclass(eq=False)
class If(Node):
    """`if cond:` then `elif`/`else`: an `elif` is an If alone in the `else` branch."""
    cond: Expr
    then: list[Stmt]
    orelse: list[Stmt]


@dataclass(eq=False)
class ExprStmt(Node):
    expr: Expr


Stmt = Assign | Return | For | If | ExprStmt


# ---- items ------------------------------------------------------------------------------------

@dataclass(eq=False)
class DeviceOption(Node):
    kind: str  # "shard" (params) | "split" | "layout" (auto) | "memory"
    name: str | None  # split's dim, layout's word; memory's amount as written ("40 GiB")
    amount: int | None = None  # memory's, in bytes


@dataclass(eq=False)
class Devices(Node):
    kind: str  # cpu | cuda
    indices: list[int] | None
    options: list[DeviceOption]
    hosts: int = 1  # `devices 2 x cuda[0 1]`: the devices listed, on each of 2 hosts


@dataclass(eq=False)
class Dim(Node):
    name: str
    name_span: Span
    value: int | None
    expr: DimExpr | None = None  # `dim D = H * Dh`: a size computed from other dims


@dataclass(eq=False)
class Field(Node):
    name: str
    type: TypeExpr


@dataclass(eq=False)
class Data(Node):
    name: str
    name_span: Span
    fields: list[Field]


class MemberKind(enum.StrEnum):
    """What a model's member is: a trained tensor, a tensor training doesn't change (running
    statistics), or a sub-model (or a stack of them)."""

    PARAM = "param"
    BUFFER = "buffer"
    SUB = "sub"


@dataclass(eq=False)
class Member(Node):
    kind: MemberKind
    name: str
    type: TypeExpr
    init: Call | None


@dataclass(eq=False)
class Model(Node):
    name: str
    name_span: Span
    members: list[Member]
    params: list[DimName] = field(default_factory=list)  # `model Linear[I O]:` its dims, given where it's used


@dataclass(eq=False)
class Param(Node):
    name: str
    type: TypeExpr
    mut: bool


@dataclass(eq=False)
class Fn(Node):
    name: str
    name_span: Span
    params: list[Param]
    ret: TypeExpr | None
    body: list[Stmt]
    expr_body: bool  # `fn f(x: [n]) -> [n] = x * 2`


@dataclass(eq=False)
class Extern(Node):
    """`extern fn` (per example, on the devices) or `python fn` (a Python call in the controller)."""
    kind: str  # extern | python
    name: str
    name_span: Span
    params: list[Param]
    ret: TypeExpr | None
    target: str
    target_span: Span


@dataclass(eq=False)
class Precision(Node):
    """`precision f64`: the dtype of every tensor type written without one (f32 where there is no such
    line); `precision mixed bf16`: those stay f32, and the devices compute in bf16 where torch.autocast
    does; `precision tf32`: f32, with a GPU's products in TF32."""
    dtype: str
    dtype_span: Span
    mixed: bool = False


Item = Devices | Precision | Dim | Data | Model | Fn | Extern


@dataclass(eq=False)
class Program(Node):
    items: list[Item]
    source: str
    warnings: tuple[Diagnostic, ...] = ()  # the lexer's (W0106), in source order


def iter_nodes(node: Node) -> Iterator[Node]:
    """Every node under `node`, itself first."""
    yield node
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, list):
                for sub in item:
                    if isinstance(sub, Node):
                        yield from iter_nodes(sub)
            elif isinstance(item, Node):
                yield from iter_nodes(item)
