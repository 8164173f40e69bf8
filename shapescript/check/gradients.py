"""Arithmetic of gradients and reading a gradient's fields, as the checker types them.

A `Grad[M]` is a value for each of M's trained params. Gradients of one model add and subtract
(`g1 + g2`: the gradient of the sum of the losses) and scale by a number or a float `[]` (`g / 4`:
nanoGPT's `loss / gradient_accumulation_steps`); nothing else. `g.w` is the gradient of param `w`
(its type), `g.enc` the gradient of a sub-model (a `Grad` of it). Both are device work, done where
the gradients are: on several devices, on the workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..shapes import value_types as T
from ..syntax import tree as A

if TYPE_CHECKING:
    from .bodies import BodyChecker

SCALES = {"*", "/"}
SUMS = {"+", "-"}


def _scale(t: T.Ty) -> bool:
    """A number a gradient may be scaled by: an int or float, or a float `[]` tensor."""
    return (isinstance(t, T.ScalarT) and t.kind in ("int", "float")
            or isinstance(t, T.TensorT) and t.rank == 0 and t.is_float)


def gradient_arith(ck: BodyChecker, node: A.Binary, left: T.Ty, right: T.Ty) -> T.Ty:
    """`node`, one of whose operands is a `Grad[M]`: a `Grad[M]`, or an error."""
    ck.device_work(f"`{node.op}` of gradients", node.span)
    if isinstance(left, T.GradT) and isinstance(right, T.GradT):
        if node.op in SUMS:
            if left.model is not right.model:
                return ck.error("E0408", f"`{node.op}` of gradients of different models: {left.show()} and "
                                f"{right.show()}", node.span, f"{left.show()} and {right.show()}",
                                "add gradients of one model only (each param's with its own)")
            return left
        return ck.error("E0408", f"`{node.op}` of two gradients", node.span, "two gradients",
                        "gradients add (`g1 + g2`) and scale by a number (`g / 4`, `g * s`)")
    grad, other, other_node = ((left, right, node.right) if isinstance(left, T.GradT) else (right, left, node.left))
    assert isinstance(grad, T.GradT)
    if node.op == "*" or (node.op == "/" and grad is left):
        if _scale(other):
            return grad
        return ck.error("E0408", f"`{node.op}` of a gradient and {other.show()}", other_node.span,
                        f"this is {other.show()}", "a gradient scales by a number or a float `[]`")
    return ck.error("E0408", f"`{node.op}` of a gradient and {other.show()}", node.span,
                    f"{left.show()} {node.op} {right.show()}",
                    "gradients add to gradients of the same model (`g1 + g2`) and scale by a number "
                    "(`g / 4`, `g * s`)")


def gradient_field(ck: BodyChecker, node: A.Attr, grad: T.GradT) -> T.Ty:
    """`g.w`: the gradient of param `w`, of its type; `g.enc`: a `Grad` of sub-model `enc`."""
    model = grad.model
    member = model.members.get(node.name)
    trained = [name for name, m in model.members.items() if m.kind != A.MemberKind.BUFFER]
    if member is None or member.kind == A.MemberKind.BUFFER:
        what = "a buffer, which training doesn't change" if member is not None else "no member of it"
        return ck.error("E0203", f"{grad.show()} has no field `{node.name}`: it is {what}", node.name_span,
                        "no gradient", f"its fields: {', '.join(trained)}" if trained else "its model has no params")
    ck.device_work("a gradient's field", node.span)
    if member.model is not None:
        if member.count is not None:
            return ck.error("E0203", f"`{node.name}` is a stack of {member.model.name}; a gradient's field "
                            "can't read a stack", node.name_span, "a stack",
                            f"read the fields of `{node.name}` in the model's own functions")
        return T.GradT(member.model)
    assert member.tensor is not None
    return member.tensor
