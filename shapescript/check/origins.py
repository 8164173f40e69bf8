"""Where a value's axes come from, for the secondary labels of shape errors (rustc's `-` underlines).

A mismatch at one place often has its cause at another: the parameter whose declared type fixed a
dim, the model member `param w: [D H]`, the line that assigned a local. These functions find that
place for an expression, so that a diagnostic can point at it beside the primary span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import Span
from ..ops.checking import Label
from ..shapes import value_types as T
from ..shapes.kinds import CallKind
from ..syntax import tree as A

if TYPE_CHECKING:
    from .bodies import BodyChecker



@dataclass(frozen=True)
class Origin:
    """The declaration an expression's type comes from: `declared` is the type as written (None for
    a local, whose place is `span`, its assignment); `lead` counts the axes the value has in front
    of the written ones (a batch field's batch axes)."""

    what: str  # "`x`", "`m.w1`", "`batch.img`"
    span: Span
    declared: A.TypeExpr | None = None
    lead: int = 0


def origin(ck: BodyChecker, node: A.Node) -> Origin | None:
    """Where `node`'s type was declared or bound, if it is a name or a member or field of one."""
    if isinstance(node, A.Name):
        var = ck.vars.get(node.id)
        if var is None:
            return None
        param = next((p for p in ck.fn.params if p.name == node.id and p.node.span == var.span), None)
        if param is not None:  # still the parameter, not a local assigned over it
            return Origin(f"`{node.id}`", param.node.type.span, param.node.type)
        return Origin(f"`{node.id}`", var.span)
    if isinstance(node, A.Attr) and isinstance(node.obj, A.Name):
        owner = ck.tables.types.get(node.obj)
        what = f"`{node.obj.id}.{node.name}`"
        if isinstance(owner, T.ModelT) and node.name in owner.members:
            member = owner.members[node.name].node
            return Origin(what, member.type.span, member.type)
        if isinstance(owner, T.BatchT) and node.name in owner.data.field_nodes:
            field = owner.data.field_nodes[node.name]
            return Origin(what, field.type.span, field.type, len(owner.axes))
    return None


def _passed_through(ck: BodyChecker, node: A.Node, k: int) -> tuple[A.Node, int]:
    """The operand axis `k` of `node` comes from, followed through the operations that keep it: an
    elementwise operation or built-in call (as `relu(h)`) with an operand of the result's type, and
    `@`, whose result's leading axes are its left side's and whose last is its right side's."""
    while True:
        t = ck.tables.types.get(node)
        if not isinstance(t, T.TensorT) or t.rank == 0:
            return node, k
        k %= t.rank
        if isinstance(node, A.Binary) and node.op == "@":
            left, right = (ck.tables.types.get(n) for n in (node.left, node.right))
            if not (isinstance(left, T.TensorT) and isinstance(right, T.TensorT)):
                return node, k
            if k < left.rank - 1:
                node = node.left
            else:
                node, k = node.right, k - (left.rank - 1) + 1
            continue
        operands: list[A.Expr] = []
        if isinstance(node, A.Binary):
            operands = [node.left, node.right]
        elif isinstance(node, A.Call) and _builtin(ck, node):
            operands = [a.value for a in node.args if not isinstance(a.value, A.Pattern)]
        same = next((o for o in operands if ck.tables.types.get(o) == t), None)
        if same is None:
            return node, k
        node = same


def _builtin(ck: BodyChecker, node: A.Call) -> bool:
    """A call of a built-in function (a user's function's result is its declared type, not an operand's)."""
    call = ck.tables.calls.get(node)
    return call is not None and call.kind == CallKind.BUILTIN


def axis_label(ck: BodyChecker, node: A.Node, t: T.TensorT, k: int, which: str) -> Label | None:
    """A secondary label at the place that gave axis `k` of `node` (of type `t`; k may count from
    the end), worded with `which` ("last axis", "dim 1"): the axis in its declared type when the
    type is written axis by axis, else the declaration or assignment as a whole. An axis passed
    through operations is followed to the operand it comes from."""
    source, j = _passed_through(ck, node, k)
    if source is not node:
        found_t = ck.tables.types.get(source)
        if isinstance(found_t, T.TensorT):
            node, t, k = source, found_t, j
            which = "last axis" if j == t.rank - 1 else "first axis" if j == 0 else f"dim {j}"
    found = origin(ck, node)
    if found is None or t.rank == 0:
        return None
    axis = t.axes[k % t.rank]
    written = found.declared
    if isinstance(written, A.ShapeType) and len(written.axes) + found.lead == t.rank:
        j = k % t.rank - found.lead
        if j >= 0:
            return written.axes[j].span, f"{found.what}'s {which} is {axis.show()} here"
    if written is not None:
        return found.span, f"{found.what} is declared here"
    return found.span, f"{found.what} is {t.show()} from here"


def type_label(ck: BodyChecker, node: A.Node, t: T.Ty) -> Label | None:
    """A secondary label at the declaration or assignment that gave `node` its type `t`."""
    found = origin(ck, node)
    if found is None:
        return None
    if found.declared is not None and found.lead:  # a field: its type is written without the batch
        return found.span, f"{found.what} is declared here"
    return found.span, f"{found.what} is {t.show()} {'here' if found.declared is not None else 'from here'}"
