"""Walks over the IR: its statements, its expressions, and the sizes a function reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from ..shapes.options import SizesOptions
from . import nodes as N


def statements(body: tuple[N.Stmt, ...]) -> Iterator[N.Stmt]:
    """Every statement of `body`, those in loops and branches included, in the source's order."""
    for s in body:
        yield s
        for inner in inner_bodies(s):
            yield from statements(inner)


def inner_bodies(s: N.Stmt) -> tuple[tuple[N.Stmt, ...], ...]:
    """The blocks statement `s` holds: a loop's body, a branch's two."""
    if isinstance(s, N.For):
        return (s.body,)
    if isinstance(s, N.If):
        return (s.then, s.orelse)
    return ()


def exprs(e: N.Expr) -> Iterator[N.Expr]:
    """`e` and every expression inside it, each before those inside it."""
    yield e
    for field in dataclasses.fields(e):
        value = getattr(e, field.name)
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, N.Expr):
                yield from exprs(v)


def walk(body: tuple[N.Stmt, ...]) -> Iterator[N.Expr]:
    """Every expression in `body`, nested ones included, in the source's order."""
    for s in body:
        for field in dataclasses.fields(s):
            value = getattr(s, field.name)
            if isinstance(value, N.Expr):
                yield from exprs(value)
        for inner in inner_bodies(s):
            yield from walk(inner)


def sizes_read(body: tuple[N.Stmt, ...]) -> tuple[N.ParamSize, ...]:
    """The generic dims' sizes a function's body reads off its parameters, each once, in the order
    the body first reads them: dims used as numbers, and ops that are given sizes."""
    found: list[N.ParamSize] = []
    for e in walk(body):
        if isinstance(e, N.Size):
            sources: tuple[N.SizeSource | None, ...] = (e.source,)
        elif isinstance(e, N.CausalMask):
            sources = e.sizes
        elif isinstance(e, N.OpCall):
            sources = e.options.sizes if isinstance(e.options, SizesOptions) else ()
        else:
            continue
        found += [s for s in sources if isinstance(s, tuple) and s not in found]
    return tuple(found)


def source_exprs(e: N.Expr) -> Iterator[N.Expr]:
    """`e` and every expression inside it, each before those inside it, as `exprs` but with a
    call's arguments in the order the source writes them (the IR keeps the callee's order)."""
    yield e
    inner: list[N.Expr] = []
    for field in dataclasses.fields(e):
        value = getattr(e, field.name)
        inner += [v for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, N.Expr)]
    if isinstance(e, N.OpCall | N.FnCall | N.GradCall):
        inner.sort(key=lambda v: (v.span.line, v.span.col))
    for v in inner:
        yield from source_exprs(v)


def statement_parts(s: N.Stmt) -> Iterator[N.Expr | N.Target]:
    """What statement `s` itself holds (a loop's body and a branch's aside), in the order the source writes it: the
    names it binds before its value, a loop's variable before what it loops over."""
    if isinstance(s, N.Assign):
        yield from s.targets
        yield from source_exprs(s.value)
    elif isinstance(s, N.For):
        yield s.var
        yield from source_exprs(s.iter)
    elif isinstance(s, N.If):
        yield from source_exprs(s.cond)
    elif isinstance(s, N.Return):
        if s.value is not None:
            yield from source_exprs(s.value)
    else:
        assert isinstance(s, N.Do), s
        yield from source_exprs(s.expr)


def source_order(body: tuple[N.Stmt, ...]) -> Iterator[N.Expr | N.Target]:
    """Every expression and bound name of `body`, loops' and branches' included, in the source's order."""
    for s in body:
        yield from statement_parts(s)
        for inner in inner_bodies(s):
            yield from source_order(inner)
