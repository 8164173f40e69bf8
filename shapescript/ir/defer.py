"""Calls whose results a controller's loop need not wait for.

On several devices the controller runs a loop's body and sends each step to the workers. When the
body only writes a step's result to a sink, the controller can send the next step before the
answer to this one arrives, so the workers go from one step to the next without waiting for a
round trip (parallel/pipeline.py). This pass marks those calls (`FnCall.later`); it is a fact of
the typed program, so the runtime never guesses how a result is used.

A call is marked when all of these hold:
- it calls a fn that runs on the workers, directly in a `for` loop's body, in a fn that runs in
  the controller;
- it is a value of `logs(...)` in `write(sink, logs(...))`; or it is the whole value of an
  assignment, and each name it assigns is assigned nowhere else in the fn (nor a parameter or loop
  variable) and is read only as a value of such a `logs(...)` later in that body.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from ..ops import OPS
from ..shapes.kinds import CallKind
from ..shapes.plans import Where
from . import nodes as N
from .walk import exprs, statements, walk


def defer(module: N.Module) -> N.Module:
    on_workers = frozenset(f.name for f in module.functions if f.placement.where == Where.WORKERS)
    if not on_workers:
        return module
    return dataclasses.replace(module, functions=tuple(
        _deferred(f, on_workers) if f.placement.where == Where.CONTROLLER else f for f in module.functions))


def _deferred(fn: N.Function, on_workers: frozenset[str]) -> N.Function:
    writes = Counter(t.name for s in statements(fn.body) if isinstance(s, N.Assign) for t in s.targets)
    writes.update(s.var.name for s in statements(fn.body) if isinstance(s, N.For))
    writes.update(p.name for p in fn.params)
    reads = Counter(n.id for n in walk(fn.body) if isinstance(n, N.Name))
    return dataclasses.replace(fn, body=_body(fn.body, False, on_workers, writes, reads))


def _body(body: tuple[N.Stmt, ...], in_loop: bool, on_workers: frozenset[str], writes: Counter[str],
          reads: Counter[str]) -> tuple[N.Stmt, ...]:
    out: list[N.Stmt] = []
    for k, s in enumerate(body):
        if isinstance(s, N.For):
            s = dataclasses.replace(s, body=_body(s.body, True, on_workers, writes, reads))
        elif isinstance(s, N.If):
            s = dataclasses.replace(s, then=_body(s.then, in_loop, on_workers, writes, reads),
                                    orelse=_body(s.orelse, in_loop, on_workers, writes, reads))
        elif (in_loop and isinstance(s, N.Assign) and isinstance(s.value, N.FnCall) and _on_workers(s.value, on_workers)
              and _only_logged(tuple(t.name for t in s.targets), body[k + 1:], writes, reads)):
            s = dataclasses.replace(s, value=dataclasses.replace(s.value, later=True))
        elif in_loop and isinstance(s, N.Do) and (logged := _logged_record(s)) is not None:  # logs(loss=step(...))
            write, record = logged
            values = tuple(dataclasses.replace(a, later=True) if isinstance(a, N.FnCall) and _on_workers(a, on_workers)
                           else a for a in record.args)
            s = dataclasses.replace(s, expr=dataclasses.replace(
                write, args=(write.args[0], dataclasses.replace(record, args=values))))
        out.append(s)
    return tuple(out)


def _on_workers(e: N.FnCall, on_workers: frozenset[str]) -> bool:
    return e.kind == CallKind.FN and e.name in on_workers


def _logged_record(s: N.Stmt) -> tuple[N.OpCall, N.OpCall] | None:
    """(the `write`, its `logs(...)`) of a statement `write(sink, logs(...))`, else None."""
    if isinstance(s, N.Do) and isinstance(s.expr, N.OpCall) and OPS[s.expr.op].writes_record:
        record = s.expr.args[1]
        if isinstance(record, N.OpCall) and OPS[record.op].makes_record:
            return s.expr, record
    return None


def _only_logged(names: tuple[str, ...], rest: tuple[N.Stmt, ...], writes: Counter[str],
                 reads: Counter[str]) -> bool:
    """Whether each of `names` is assigned once and read only as a logged value in `rest`'s writes."""
    if any(writes[n] != 1 for n in names):
        return False
    logged: Counter[str] = Counter()
    for s in rest:
        logged_here = _logged_record(s)
        if logged_here is None or _reads(logged_here[0].args[0], names):
            continue
        record = logged_here[1]
        logged.update(a.id for a in record.args if isinstance(a, N.Name) and a.id in names)
        if any(a is not None and not isinstance(a, N.Name) and _reads(a, names) for a in record.args):
            return False
    return all(logged[n] == reads[n] for n in names)


def _reads(e: N.Expr | None, names: tuple[str, ...]) -> bool:
    return e is not None and any(isinstance(x, N.Name) and x.id in names for x in exprs(e))
