"""Patterns such as `b n (3 H Dh) -> b H n Dh`: checked once into a recipe that lowering turns into
reshape / permute / reduce calls, as einops does, but with the shapes known at compile time.

A pattern's names are its own: they bind, position by position, to the operand's axes (`b d`
matches `[b D]`). A group `(3 H Dh)` splits one axis into parts; each part's size comes from the
axis's own group parts, from a literal, from a dim of the program with that name, or from a
keyword (`h=4`); at most one part per group may be left to be inferred.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy

from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.options import PatternOptions
from ..syntax import tree as A
from .checking import RuleChecker


class PatternError(Exception):
    def __init__(self, message: str, node: A.Node, label: str = "", help: str = "") -> None:
        super().__init__(message)
        self.node, self.label, self.help = node, label, help


@dataclass
class Atom:
    """An elementary axis of a pattern: a name or a literal, and its size."""
    name: str | None
    size: D.Dim
    axis: T.AxisT | None = None  # the whole operand axis, when the atom is one


@dataclass
class Side:
    """One side of a pattern as atoms, with how the axes group them."""
    atoms: list[Atom] = field(default_factory=list)
    groups: list[list[int]] = field(default_factory=list)  # per axis: indices of its atoms


def parse_side(axes: list[A.PatAxis], what: str) -> list[tuple[A.PatAxis, list[A.PatAxis]]]:
    """Each axis of a side with its elementary parts (a group's members, or itself)."""
    out = []
    for ax in axes:
        if ax.group is not None:
            for part in ax.group:
                if part.group is not None:
                    raise PatternError("groups can't nest in a pattern", part, "a nested group",
                                       "write the parts in one group: (a b c)")
            if not ax.group:
                raise PatternError("an empty group `()`", ax)
            out.append((ax, ax.group))
        else:
            out.append((ax, [ax]))
    return out


def bind_lhs(ck: RuleChecker, operand: T.TensorT, axes: list[A.PatAxis], known: dict[str, T.AxisT],
             sizes: dict[str, D.Dim], node: A.Node) -> Side:
    """Bind a left side's names to `operand`'s axes; `known` collects name -> axis across operands."""
    parts = parse_side(axes, "left")
    if len(parts) != operand.rank:
        raise PatternError(f"the pattern has {len(parts)} axes, but the operand is {operand.show()}, "
                           f"with {operand.rank}", node, f"{len(parts)} axes here",
                           "write one name or group per axis of the operand")
    side = Side()
    names = [m.name for _, members in parts for m in members if m.name]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PatternError(f"`{twice[0]}` names two axes of one operand", node, "a name twice",
                           "give each axis its own name")
    for (ax, members), axis in zip(parts, operand.axes):
        start = len(side.atoms)
        if ax.group is None:
            side.atoms.append(_whole(ax, axis, known))
        else:
            side.atoms.extend(_split(ck, ax, members, axis, known, sizes))
        side.groups.append(list(range(start, len(side.atoms))))
    return side


def _whole(ax: A.PatAxis, axis: T.AxisT, known: dict[str, T.AxisT]) -> Atom:
    if ax.size is not None:
        if not D.equal(axis.size, D.literal(ax.size)):
            raise PatternError(f"the pattern says {ax.size}, but this axis is {axis.show()}", ax,
                               f"not {axis.show()}")
        return Atom(None, axis.size, axis)
    assert ax.name is not None
    _check_same(ax, known, axis)
    known[ax.name] = axis
    return Atom(ax.name, axis.size, axis)


def _check_same(ax: A.PatAxis, known: dict[str, T.AxisT], axis: T.AxisT) -> None:
    old = known.get(ax.name or "")
    if old is not None and not old.same(axis):
        raise PatternError(f"`{ax.name}` is {old.show()} in one place and {axis.show()} in another", ax,
                           f"this is {axis.show()}", "a name in a pattern is one dim")


def _split(ck: RuleChecker, ax: A.PatAxis, members: list[A.PatAxis], axis: T.AxisT,
           known: dict[str, T.AxisT], sizes: dict[str, D.Dim]) -> list[Atom]:
    if axis.parts is not None and len(axis.parts) == len(members):
        atoms = []
        for m, size in zip(members, axis.parts):
            if m.size is not None and not D.equal(size, D.literal(m.size)):
                raise PatternError(f"the pattern says {m.size}, but this part is {D.show(size)}", m)
            if m.name is not None:
                _check_same(m, known, T.axis(size))
                known[m.name] = T.axis(size)
            atoms.append(Atom(m.name, size))
        return atoms
    given: list[D.Dim | None] = []
    for m in members:
        if m.size is not None:
            given.append(D.literal(m.size))
        elif m.name in known:
            given.append(known[m.name].size)
        elif m.name in sizes:
            given.append(sizes[m.name])
        elif m.name is not None and m.name in ck.dim_values:
            given.append(D.declared(m.name))
        else:
            given.append(None)
    unknown = [k for k, g in enumerate(given) if g is None]
    if len(unknown) > 1:
        names = ", ".join(f"`{members[k].name}`" for k in unknown)
        raise PatternError(f"can't tell how {axis.show()} splits into {names}", ax, "sizes unknown",
                           f"give all but one size, as `{members[unknown[0]].name}=4`")
    product = sympy.Integer(1)
    for g in given:
        if g is not None:
            product *= g
    if any(m.size is not None and m.size <= 0 for m in members):
        raise PatternError("a part's size must be positive", ax, "not a size")
    if unknown:
        part = given[unknown[0]] = sympy.simplify(axis.size / product)
        inferred = sympy.sympify(part.xreplace(
            {s: v for s in D.symbols(part) if (v := ck.dim_values.get(s.name)) is not None}))
        if inferred.is_number and (not inferred.is_integer or inferred <= 0):
            raise PatternError(f"{axis.show()} doesn't split evenly into this group: a part would be {inferred}",
                               ax, "doesn't divide")
    elif not D.equal(product, axis.size) and not _same_value(product, axis.size, ck.dim_values):
        # Splitting a declared dim into declared parts is allowed when their sizes agree: the
        # pattern says how to read the axis, as a cast would.
        raise PatternError(f"the group's parts multiply to {D.show(product)}, but the axis is {axis.show()}",
                           ax, f"not {axis.show()}")
    atoms = []
    for m, g in zip(members, given):
        assert g is not None
        if m.name is not None:
            _check_same(m, known, T.axis(g))
            known[m.name] = T.axis(g)
        atoms.append(Atom(m.name, g))
    return atoms


def _same_value(a: D.Dim, b: D.Dim, values: Mapping[str, int | None]) -> bool:
    va, vb = D.value(a, values), D.value(b, values)
    return va is not None and va == vb


def build_rhs(axes: list[A.PatAxis], known: dict[str, T.AxisT], new: dict[str, D.Dim]) -> tuple[Side, tuple[T.AxisT, ...]]:
    """A right side's atoms and the result's axes; names come from the left side or from `new`."""
    side = Side()
    result: list[T.AxisT] = []
    for ax, members in parse_side(axes, "right"):
        start = len(side.atoms)
        for m in members:
            if m.size is not None:
                raise PatternError("a literal size can't stand on the right side", m, "a literal",
                                   "name the axis, and give its size as a keyword: `n=4`")
            if m.name in known:
                side.atoms.append(Atom(m.name, known[m.name].size, known[m.name]))
            elif m.name in new:
                side.atoms.append(Atom(m.name, new[m.name]))
            else:
                raise PatternError(f"`{m.name}` is on the right but not on the left", m, "unknown here",
                                   "every name on the right must be on the left (or given a size: n=4)")
        side.groups.append(list(range(start, len(side.atoms))))
        atoms = side.atoms[start:]
        if ax.group is None:
            a = atoms[0]
            result.append(a.axis if a.axis is not None else T.axis(a.size))
        else:
            result.append(T.group(tuple(_flat_parts(a) for a in atoms)))
    names = [a.name for a in side.atoms if a.name]
    repeated = {n for n in names if names.count(n) > 1}
    if repeated:
        name = sorted(repeated)[0]
        raise PatternError(f"`{name}` appears twice on the right", axes[0], "", "each name once")
    return side, tuple(result)


def _flat_parts(atom: Atom) -> D.Dim:
    return atom.size


def lower_recipe(lhs: Side, rhs: Side, keep: list[int], node: A.Node, values: Mapping[str, int | None]
                 ) -> PatternOptions:
    """How to get from the operand to the result: split its axes into atoms, permute the atoms
    that survive (`keep`, in the right side's order), and merge them into the result's axes.

    A split size is an int, ("axis", k) for the size of the operand's k-th axis, or -1 for the one
    part of a group left to be inferred; everything else is known at compile time.
    """
    whole: dict[D.Dim, int] = {}  # the size of an operand axis that is one atom -> its index
    for k, group in enumerate(lhs.groups):
        if len(group) == 1:
            whole.setdefault(lhs.atoms[group[0]].size, k)
    split: list[tuple[int | tuple[str, int], ...] | None] = []
    for group in lhs.groups:
        if len(group) == 1:
            split.append(None)
            continue
        sizes: list[int | tuple[str, int]] = []
        for k in group:
            size = lhs.atoms[k].size
            value = D.value(size, values)
            if value is not None:
                sizes.append(value)
            elif size in whole:
                sizes.append(("axis", whole[size]))
            else:
                sizes.append(-1)
        if sizes.count(-1) > 1:
            raise PatternError("can't tell the sizes of this group's parts when the program runs", node,
                               "", "give the parts' sizes as dims of the program")
        split.append(tuple(sizes))
    return PatternOptions(
        split=tuple(split) if any(s is not None for s in split) else None,
        perm=tuple(keep) if list(keep) != sorted(keep) or len(keep) != len(lhs.atoms) else None,
        merge=tuple(len(g) for g in rhs.groups) if any(len(g) != 1 for g in rhs.groups) else None)
