"""A pass as a rewrite: a rule that looks at one expression of the IR and gives the node to put in
its place, or None to keep it, applied to every expression of every function, innermost first."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from . import nodes as N

Rule = Callable[[N.Expr], N.Expr | None]
# A rule that also sees the node as it was before the expressions inside it were rewritten: a pass
# that decided what to do with each node of the IR it was given (by identity) looks it up so.
Change = Callable[[N.Expr, N.Expr], N.Expr]
Node = TypeVar("Node", N.Expr, N.Stmt)


def rewrite(module: N.Module, rule: Rule) -> N.Module:
    """`module` with `rule` applied to each expression of each function's body, the expressions
    inside it first; a node the rule gives is not rewritten again. A rule must keep what the node
    means: its type, and the sizes the function reads (`Function.sizes`) unless it adds none."""
    def change(_: N.Expr, inner: N.Expr) -> N.Expr:
        replaced = rule(inner)
        return inner if replaced is None else replaced
    return dataclasses.replace(module, functions=tuple(
        dataclasses.replace(f, body=rewrite_body(f.body, change)) if f.body else f for f in module.functions))


def rewrite_body(body: tuple[N.Stmt, ...], change: Change) -> tuple[N.Stmt, ...]:
    """`body` with each expression `e` replaced by `change(e, e with its inner expressions
    rewritten)`, innermost first."""
    return tuple(_inner(s, change) for s in body)


def _expression(e: N.Expr, change: Change) -> N.Expr:
    return change(e, _inner(e, change))


def _inner(node: Node, change: Change) -> Node:
    """`node` with the expressions and statements it holds rewritten (itself not yet)."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if isinstance(value, N.Expr):
            changes[field.name] = _expression(value, change)
        elif isinstance(value, tuple) and any(isinstance(v, N.Expr | N.Stmt) for v in value):
            changes[field.name] = tuple(_expression(v, change) if isinstance(v, N.Expr)
                                        else _inner(v, change) if isinstance(v, N.Stmt) else v for v in value)
    return dataclasses.replace(node, **changes) if changes else node
