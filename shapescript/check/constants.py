"""Values the checker computes before anything runs: the sizes of dims defined from other dims
(`dim D = H * Dh`) and the numbers an initializer is given (`normal(std=0.02 / sqrt(2 * L))`).

A derived dim's size follows from its parts, so it is never given when loading (E0202); its
definition, in dims that aren't derived, goes in `ctx.derived`, which `dims.equal` reads while the
program is checked. Dims may be declared in any order; a dim defined from itself is E0314.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import sympy

from ..names import similar
from ..shapes import dims as D
from ..syntax import tree as A
from ..syntax.lexer import MAX_INT_DIGITS

if TYPE_CHECKING:
    from .context import Context

# ---- dims defined from other dims -------------------------------------------------------------


def dim_names(node: A.DimExpr) -> Iterator[A.DimName]:
    if isinstance(node, A.DimName):
        yield node
    elif isinstance(node, A.DimBin):
        yield from dim_names(node.left)
        yield from dim_names(node.right)


def derive_dims(ctx: Context, items: list[A.Dim]) -> None:
    """Compute each derived dim's definition and size, parts first (as Kahn's algorithm orders
    them, so a long chain can't overflow Python's stack)."""
    defs = {item.name: item for item in items if item.expr is not None}
    for name in ctx.dim_override.keys() & defs.keys():
        node = defs[name]
        assert node.expr is not None
        given_instead = list(dict.fromkeys(n.name for n in dim_names(node.expr)))
        ctx.error("E0202", f"the size of dim `{name}` is given twice: computed as {_written(ctx, node)} here, "
                  f"and {ctx.dim_override[name]} when loading", node.span, "computed from other dims",
                  f"give the size of {' or '.join(f'`{p}`' for p in given_instead)} instead"
                  if given_instead else f"remove `{name}` from the sizes given when loading")
    waiting: dict[str, set[str]] = {}
    for name, node in defs.items():
        assert node.expr is not None
        unknown = [n for n in dim_names(node.expr) if n.name not in ctx.dim_values]
        for n in unknown:
            ctx.error("E0201", f"unknown dim `{n.name}` in the size of `{name}`", n.span, "not declared",
                      similar(n.name, ctx.dim_values) or f"declare it: `dim {n.name} = 64`")
        if not unknown:
            waiting[name] = {n.name for n in dim_names(node.expr) if n.name in defs}
    ready = [name for name, parts in waiting.items() if not parts]
    while ready:
        name = ready.pop()
        del waiting[name]
        if not _define(ctx, defs[name]):
            continue  # its users stay waiting, silently: the error is reported here
        for other, parts in waiting.items():
            if name in parts:
                parts.discard(name)
                if not parts:
                    ready.append(other)
    _report_cycles(ctx, defs, waiting)


def _define(ctx: Context, node: A.Dim) -> bool:
    assert node.expr is not None
    written = _sympy(node.expr)
    definition = sympy.expand(written.xreplace({s: ctx.derived[s.name] for s in D.symbols(written)
                                                if s.name in ctx.derived}))
    known = {s: ctx.dim_values[s.name] for s in D.symbols(definition) if ctx.dim_values.get(s.name) is not None}
    digits = _digits_to_compute(definition, {s.name: v for s, v in known.items() if v is not None})
    if digits > 2 * MAX_INT_DIGITS:  # `dim B = A * A` a few dozen times over: never computed
        return _too_large(ctx, node, f"about {digits:,.0f}")
    size = sympy.sympify(definition.xreplace(known))
    if size.is_number and abs(size) >= 10 ** MAX_INT_DIGITS:
        return _too_large(ctx, node, f"{D.digit_count(abs(int(size))):,}")
    if size.is_number and (not size.is_integer or size <= 0):
        given = ", ".join(f"{s.name} = {v}" for s, v in sorted(known.items(), key=lambda kv: kv[0].name))
        ctx.error("E0310", f"dim `{node.name}` = {_written(ctx, node)} is {size}"
                  + (f" with {given}" if given else "") + ", not a positive whole size", node.span, "not a size",
                  "a size is a whole number of 1 or more: change the expression or the sizes it is made of")
        return False
    ctx.derived[node.name] = definition
    ctx.dim_values[node.name] = int(size) if size.is_number else None
    return True


def _too_large(ctx: Context, node: A.Dim, digits: str) -> bool:
    ctx.error("E0310", f"dim `{node.name}` = {_written(ctx, node)} is a size of {digits} digits", node.span,
              "too large a size", f"a size has at most {MAX_INT_DIGITS} digits: change the expression or the "
              "sizes it is made of")
    return False


def _digits_to_compute(definition: D.Dim, known: dict[str, int]) -> float:
    """About how many digits computing `definition` with the sizes `known` would write, at most:
    found from its terms' exponents, without computing it (a chain of squares doubles them each line)."""
    total = 0.0
    for term in sympy.Add.make_args(definition):
        for factor in sympy.Mul.make_args(term):
            base, exponent = factor.as_base_exp()
            if isinstance(base, sympy.Rational):
                size = abs(base.p) * base.q
            elif isinstance(base, sympy.Symbol) and base.name in known:
                size = known[base.name]
            else:
                continue  # a dim without a size yet: nothing is computed
            try:
                total += abs(float(exponent)) * math.log10(max(size, 1))
            except (OverflowError, TypeError):
                return math.inf
    return total


def _report_cycles(ctx: Context, defs: dict[str, A.Dim], waiting: dict[str, set[str]]) -> None:
    """One E0314 per cycle among the dims still waiting; a dim that only uses a cycle is silent."""
    order = list(defs)
    reported: set[str] = set()
    for start in waiting:
        path, name = [start], start
        while name not in reported:
            parts = waiting[name] & waiting.keys()
            if not parts:
                break  # it waits on a dim whose own error is reported
            name = min(parts, key=order.index)  # the first-declared part still waiting
            if name in path:
                ring = path[path.index(name):]
                first = min(ring, key=order.index)
                ring = ring[ring.index(first):] + ring[:ring.index(first)]
                ctx.error("E0314", f"dim `{first}` is defined from itself", defs[first].span, "a cycle",
                          "the cycle: " + " -> ".join(ring + [first]),
                          f"give one of them a size of its own, as `dim {first} = 64`")
                break
            path.append(name)
        reported.update(path)


def _sympy(node: A.DimExpr) -> D.Dim:
    """A dim expression whose names are all declared dims, as sympy."""
    if isinstance(node, A.DimInt):
        return D.literal(node.value)
    if isinstance(node, A.DimName):
        return D.declared(node.name)
    left, right = _sympy(node.left), _sympy(node.right)
    combined: sympy.Expr = {"+": left + right, "-": left - right, "*": left * right, "/": left / right}[node.op]
    return combined


def _written(ctx: Context, node: A.Dim) -> str:
    """The definition as the program writes it (`H * Dh`, where sympy would show `Dh*H`)."""
    line = ctx.program.source.splitlines()[node.span.line - 1]
    return line[node.span.col - 1:node.span.end_col - 1].split("=", 1)[1].strip()


# ---- initializers' arguments ------------------------------------------------------------------

FUNCTIONS: dict[str, Callable[[float], float]] = {"sqrt": math.sqrt, "exp": math.exp, "log": math.log}
ALLOWED = "numbers and declared dims, with + - * / ** and sqrt, exp, log"


class NotConstant(Exception):
    """An initializer's argument that isn't a number known when the model is made."""

    def __init__(self, node: A.Node, message: str, label: str, help: str = "") -> None:
        super().__init__(message)
        self.node, self.message, self.label, self.help = node, message, label, help


def constant(node: A.Expr, dim_values: dict[str, int | None], members: dict[str, str]) -> float | None:
    """The value of `node`, or None when a dim in it has no size yet (it is given when loading, and
    a program can be checked without it). `members`: the model's member names and kinds, to say
    what a name is when it isn't a dim. Raises NotConstant."""
    if isinstance(node, (A.IntLit, A.FloatLit)):
        return float(node.value)
    if isinstance(node, A.Name):
        if node.id in members:
            raise NotConstant(node, f"`{node.id}` is a {members[node.id]} of the model", "not a constant",
                              f"an initializer can't read the model it makes: its arguments are {ALLOWED}")
        if node.id not in dim_values:
            near = similar(node.id, dim_values)
            raise NotConstant(node, f"`{node.id}` isn't a declared dim", "not a constant",
                              near or f"an initializer runs once, when the model is made: its arguments are {ALLOWED}")
        size = dim_values[node.id]
        return float(size) if size is not None else None
    if isinstance(node, A.Unary) and node.op == "-":
        inner = constant(node.operand, dim_values, members)
        return -inner if inner is not None else None
    if isinstance(node, A.Binary) and node.op in ("+", "-", "*", "/", "**"):
        left, right = constant(node.left, dim_values, members), constant(node.right, dim_values, members)
        if left is None or right is None:
            return None
        return _arithmetic(node, left, right)
    if isinstance(node, A.Call) and isinstance(node.func, A.Name) and node.func.id in FUNCTIONS:
        if len(node.args) != 1 or node.args[0].keyword is not None or isinstance(node.args[0].value, A.Pattern):
            raise NotConstant(node, f"`{node.func.id}` takes one number", "one argument",
                              f"write it with one number, as `{node.func.id}(2 * L)`")
        arg = constant(node.args[0].value, dim_values, members)
        if arg is None:
            return None
        try:
            return _finite(node, FUNCTIONS[node.func.id](arg))
        except (ValueError, OverflowError):
            raise NotConstant(node, f"`{node.func.id}({_number(arg)})` has no value", "no value",
                              "sqrt takes a number of 0 or more, log one above 0") from None
    what = f"`{node.func.id}`" if isinstance(node, A.Call) and isinstance(node.func, A.Name) else "this"
    raise NotConstant(node, f"{what} isn't a constant number", "not a constant",
                      f"an initializer runs once, when the model is made: its arguments are {ALLOWED}")


_OPERATORS: dict[str, Callable[[float, float], float | complex]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "**": operator.pow}


def _arithmetic(node: A.Binary, left: float, right: float) -> float:
    try:
        value: float | complex = _OPERATORS[node.op](left, right)
    except ZeroDivisionError:
        raise NotConstant(node, "a division by zero", "divides by 0", "divide by a number that isn't 0") from None
    except OverflowError:
        value = math.inf
    if isinstance(value, complex):
        raise NotConstant(node, f"{_number(left)} ** {_number(right)} isn't a real number", "no real value",
                          "raise only numbers of 0 or more to a fractional power")
    return _finite(node, value)


def _finite(node: A.Node, value: float) -> float:
    if not math.isfinite(value):
        raise NotConstant(node, "a number too large for a float", "too large", "keep it within about 1e308")
    return value


def _number(value: float) -> str:
    text = str(int(value)) if value.is_integer() else str(value)
    return f"({text})" if value < 0 else text
