"""A pass as a rewrite: a rule that looks at one expression of the IR and gives the node to put in
its place, or None to keep it, applied to every expression of every function, innermost first."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from . import nodes as N

Rule = Callable[[N.Expr], N.Expr | None]
Node = TypeVar("Node", N.Expr, N.Stmt)


def rewrite(module: N.Module, rule: Rule) -> N.Module:
    """`module` with `rule` applied to each expression of each function's body, the expressions
    inside it first; a node the rule gives is not rewritten again. A rule must keep what the node
    means: its type, and the sizes the function reads (`Function.sizes`) unless it adds none."""
    return dataclasses.replace(module, functions=tuple(
        dataclasses.replace(f, body=_statements(f.body, rule)) if f.body else f for f in module.functions))


def _statements(body: tuple[N.Stmt, ...], rule: Rule) -> tuple[N.Stmt, ...]:
    return tuple(_inner(s, rule) for s in body)


def _expression(e: N.Expr, rule: Rule) -> N.Expr:
    inner = _inner(e, rule)
    replaced = rule(inner)
    return inner if replaced is None else replaced


def _inner(node: Node, rule: Rule) -> Node:
    """`node` with the expressions and statements it holds rewritten (itself not yet)."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if isinstance(value, N.Expr):
            changes[field.name] = _expression(value, rule)
        elif isinstance(value, tuple) and any(isinstance(v, N.Expr | N.Stmt) for v in value):
            changes[field.name] = tuple(_expression(v, rule) if isinstance(v, N.Expr)
                                        else _inner(v, rule) if isinstance(v, N.Stmt) else v for v in value)
    return dataclasses.replace(node, **changes) if changes else node
