"""Typing rules of the arithmetic of plain numbers, as Python computes it (every built-in function,
the training steps' and the controller's included, is an op of the table in ops/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..dtypes import FLOAT_DTYPES
from ..ops.args import literal_number
from ..shapes import value_types as T
from ..shapes.options import NO_RECIPE
from ..syntax import tree as A

if TYPE_CHECKING:
    from .bodies import BodyChecker

# ---- arithmetic of plain numbers, typed as Python computes it --------------------------------

def number_arith(ck: BodyChecker, node: A.Binary, left: T.ScalarT, right: T.ScalarT) -> T.Ty:
    """`left op right` of two plain numbers (int, float, bool): float with a float or for `/`; a
    whole number to a whole power is an int when the exponent is at least 0 and a float below
    (`2 ** -1` is 0.5), so the exponent must be known: a literal or a dim's size."""
    if "float" in (left.kind, right.kind) or node.op == "/":
        return T.FLOAT
    if node.op != "**":
        return T.INT
    exponent = _whole_exponent(ck, node, "of two whole numbers is an int for an exponent of 0 or more and a "
                               "float below")
    if exponent is None:
        return T.UNKNOWN
    return T.INT if exponent >= 0 else T.FLOAT


def whole_tensor_power(ck: BodyChecker, node: A.Binary, dtype: str, number: T.ScalarT) -> bool:
    """`x ** k` of an integer or bool tensor and a whole number k: torch refuses a k below 0, so k
    must be known to be at least 0. False (with the error given) where it isn't."""
    if node.op != "**" or dtype in FLOAT_DTYPES or number.kind not in ("int", "bool"):
        return True
    exponent = _whole_exponent(ck, node, f"of an {dtype} tensor is refused by torch for an exponent below 0")
    if exponent is not None and exponent < 0:
        ck.error("E0308", f"`**` of an {dtype} tensor and a negative whole number: torch refuses integers "
                 "to negative powers", node.span, "a negative power", "convert first, as `to(x, f32) ** -1`")
        return False
    return exponent is not None


def _whole_exponent(ck: BodyChecker, node: A.Binary, why: str) -> int | float | None:
    """The value of `**`'s whole-number exponent, or 1 for a dim's size (positive); None, with an
    error, where its sign isn't known."""
    exponent = literal_number(node.right)
    if isinstance(node.right, A.BoolLit):
        exponent = int(node.right.value)
    if exponent is None and ck.tables.recipes.get(node.right, NO_RECIPE).dim:
        exponent = 1
    if exponent is None:
        ck.error("E0308", f"`**` {why}, and this exponent's sign isn't known", node.span, "sign unknown",
                 "write the base as a float, as `2.0 ** k` or `to(x, f32) ** k`")
    return exponent


def number_negation(t: T.Ty) -> T.Ty:
    """`-x` of a plain number: Python negates a bool as the int it is (`-true` is -1)."""
    return T.INT if t == T.BOOL else t
