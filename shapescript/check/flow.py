"""Checking loops and branches: what a loop goes over, the types its variables keep or grow by, and
the types an `if`'s branches leave behind.

A loop's body is checked once for every pass: a variable it assigns keeps its type from pass to
pass (E0406), but for one that grows by a fixed whole size each pass (appending a token along an
axis): its size is a fresh dim in the body (`t+i`: the body must hold for any size) and, after a
loop whose count the checker knows, the size before plus the growth times the count.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import sympy

from ..ops.checking import Use
from ..shapes import dims as D
from ..shapes import value_types as T
from ..syntax import tree as A

if TYPE_CHECKING:
    from .bodies import BodyChecker, Var


Growth = tuple[int, ...]  # per axis, how much one pass of a loop adds to a variable's size


def growth(old: T.Ty, new: T.Ty) -> Growth | None:
    """How `new` is `old` grown by whole sizes along some axes, or None if it isn't that."""
    if not (isinstance(old, T.TensorT) and isinstance(new, T.TensorT)) or old.rank != new.rank \
            or old.dtype != new.dtype or (old.index is None) != (new.index is None):
        return None
    if old.index is not None and new.index is not None and not D.equal(old.index, new.index):
        return None
    sizes: list[int] = []
    for a, b in zip(old.axes, new.axes):
        added = sympy.simplify(D.expand_derived(b.size) - D.expand_derived(a.size))
        if not added.is_Integer or int(added) < 0 or (added != 0 and (a.parts or b.parts)):
            return None
        sizes.append(int(added))
    return tuple(sizes) if any(sizes) else None


def grown(t: T.TensorT, by: Growth, count: D.Dim | None, passes: str, origins: dict[D.Dim, D.Dim]) -> T.TensorT:
    """`t` after `count` passes that each add `by`; where the count is only known as the program
    runs, a fresh dim named after the passes (`t+i`, `t+2·i`), kept in `origins` with the size it
    grew from (so `over=t` names it)."""
    def size(a: T.AxisT, k: int) -> D.Dim:
        if count is not None:
            total: D.Dim = a.size + k * count
            return total
        fresh = D.generic(f"{D.show(a.size)}+{passes if k == 1 else f'{k}·{passes}'}")
        origins[fresh] = a.size
        return fresh
    return T.TensorT(tuple(a if k == 0 else T.axis(size(a, k)) for a, k in zip(t.axes, by)), t.dtype, t.index)


def loop_count(t: T.Ty) -> D.Dim | None:
    """How many passes a loop over `t` makes, where the checker knows."""
    if isinstance(t, T.RangeT):
        return t.count
    if isinstance(t, T.StackT):
        return t.count
    return None


def loop(ck: BodyChecker, s: A.For) -> None:
    iterated = ck.expr(s.iter)
    var_t = loop_variable(ck, s, iterated)
    before, returned, work = dict(ck.vars), ck.returned, len(ck.fn.device_work)
    mark = len(ck.ctx.diagnostics)
    ck.bind(s.var, var_t)
    ck.stmts(s.body)
    growing = {name: by for name, old in before.items()
               if (by := growth(old.ty, ck.vars[name].ty)) is not None}
    if not growing:
        loop_keeps_types(ck, before)
        return
    # Again, from each growing variable's size on any pass: the first pass's findings are dropped.
    del ck.ctx.diagnostics[mark:]
    del ck.fn.device_work[work:]
    ck.vars, ck.returned = dict(before), returned
    entry: dict[str, T.TensorT] = {}
    for name, by in growing.items():
        old = before[name].ty
        assert isinstance(old, T.TensorT)  # growth() holds only between tensors
        entry[name] = grown(old, by, None, s.var.id, ck.grown)
        ck.vars[name] = dataclasses.replace(before[name], ty=entry[name])
    ck.bind(s.var, var_t)
    ck.stmts(s.body)
    count = loop_count(iterated)
    for name, by in growing.items():
        start, end = entry[name], ck.vars[name].ty
        expected = T.TensorT(tuple(a if k == 0 else T.axis(a.size + k) for a, k in zip(start.axes, by)),
                             start.dtype, start.index)
        if not T.same_type(expected, end):
            ck.vars[name] = dataclasses.replace(ck.vars[name], ty=expected)
            ck.error("E0406", f"`{name}` is {start.show()} as a pass of the loop starts, but the pass makes it "
                     f"{end.show()}", ck.vars[name].span, f"now {end.show()}",
                     f"a value may grow by the same size each pass, here {expected.show()}")
            continue
        old = before[name].ty
        assert isinstance(old, T.TensorT)
        ck.vars[name] = dataclasses.replace(ck.vars[name], ty=grown(old, by, count, "passes", ck.grown))
    loop_keeps_types(ck, {n: v for n, v in before.items() if n not in growing})


def loop_variable(ck: BodyChecker, s: A.For, t: T.Ty) -> T.Ty:
    """The type of the loop's variable, from what it goes over."""
    if isinstance(t, T.StackT):  # the blocks of a model, one after another
        return t.model
    if isinstance(t, T.RangeT):  # counted: each device counts the same, wherever it runs
        return T.INT
    ck.use(Use.LOOP, s.span)
    if isinstance(t, T.BatchesT):
        b = D.generic("b")
        ck.dims.setdefault("b", b)
        # Each batch of the loop pads to its own longest item: dims of its own, by the data's names.
        padded = tuple((name, D.generic(name)) for name in t.data.generics)
        ck.dims.update(padded)
        return T.BatchT((T.axis(b),), t.data, padded)
    if t is T.UNKNOWN:
        return t
    return ck.error("E0403", f"a loop goes over a dataset's batches, a stack of models or a range, not "
                      f"{t.show()}", s.iter.span, f"this is {t.show()}",
                      "write `for batch in data |> batches(64):`, `for block in m.blocks:` or "
                      "`for k in range(4):`")


def loop_keeps_types(ck: BodyChecker, before: dict[str, Var]) -> None:
    """A variable from before a loop that the loop assigns keeps its type (or grows by a fixed
    size, above): the body was checked with the types it had before."""
    for name, old in before.items():
        new = ck.vars[name]
        if new is old or T.same_type(old.ty, new.ty):
            continue
        help = (f"start it as a tensor before the loop: `{name} = to(0.0, {new.ty.dtype})`"
                if isinstance(old.ty, T.ScalarT) and isinstance(new.ty, T.TensorT) and not new.ty.axes
                else f"give the loop's result a name of its own, or make `{name}` {old.ty.show()} again")
        ck.error("E0406", f"`{name}` is {old.ty.show()} before the loop, but a pass of the loop makes it "
                   f"{new.ty.show()}", new.span, f"now {new.ty.show()}", help,
                   secondary=((old.span, f"{old.ty.show()} here"),))


# ---- branches -----------------------------------------------------------------------------


def branch(ck: BodyChecker, s: A.If) -> None:
    condition(ck, s.cond, ck.expr(s.cond))
    before, returned = dict(ck.vars), ck.returned
    ck.returned = False
    ck.stmts(s.then)
    then_vars, then_returned = ck.vars, ck.returned
    ck.vars, ck.returned = dict(before), False
    ck.stmts(s.orelse)
    else_vars, else_returned = ck.vars, ck.returned
    ck.returned = returned or (then_returned and else_returned)
    if then_returned or else_returned:  # only the other branch goes on past the `if`
        ck.vars = else_vars if then_returned else then_vars
        return
    ck.vars = {}
    for name, var in then_vars.items():
        other = else_vars.get(name)
        if other is None:
            ck.branch_only[name] = s.span
        elif var is other or T.same_type(var.ty, other.ty):
            ck.vars[name] = var
        else:
            ck.vars[name] = dataclasses.replace(var, ty=T.UNKNOWN)
            ck.error("E0410", f"`{name}` is {var.ty.show()} after one branch and {other.ty.show()} after "
                       "the other", other.span, f"{other.ty.show()} here",
                       f"make both branches leave `{name}` {var.ty.show()}, or name the values apart",
                       secondary=((var.span, f"{var.ty.show()} here"),))
    for name in else_vars.keys() - then_vars.keys():
        ck.branch_only[name] = s.span


def condition(ck: BodyChecker, node: A.Expr, t: T.Ty) -> None:
    """A condition is one bool: a plain one, or a `[] bool` tensor, which every device holds whole."""
    if t is T.UNKNOWN or t == T.BOOL or isinstance(t, T.TensorT) and not t.axes and t.dtype == "bool":
        return
    if isinstance(t, T.TensorT) and t.dtype == "bool":
        ck.error("E0409", f"a condition is one bool, not {t.show()}", node.span, f"this is {t.show()}",
                   "reduce the values it compares to one first (`max(x, over=...)` along each axis), or "
                   "choose value by value with `where(cond, a, b)`")
        return
    ck.error("E0409", f"a condition is a bool, not {t.show()}", node.span, f"this is {t.show()}",
               "compare it, as `if loss < best:` or `if k > 0:`")
