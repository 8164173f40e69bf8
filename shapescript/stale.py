"""Stale models: a model made by a program whose model type has since changed shape.

A model keeps the spec (runtime/model.py's ModelSpec) of the program that made it. When a notebook
cell changes a dim (`dim Hd = 8`) or a model block, the new program's spec of that type may give its
params other shapes, and its functions would run on tensors their types deny. Two places use this
module: the argument guard of a function's model or optimizer parameter (`current_models`, wrapped
around the built module's KindGuard at a function's first call), which refuses such a model with a
ShapeError, and the notebook's cell, which says which variables hold one (`stale_notes`).

What changed is said in the program's terms: a param's axis declared as a bare dim (`w1: [D Hd]`)
names that dim with its size then and now ("made with Hd = 3, but Hd is now 8"); any other change
names the member and its types then and now. It sits beside api.py, above check/ and runtime/,
because it reads both the checked model types (for the dims) and the run-time specs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sympy

from .errors import ShapeError
from .names import spec_var
from .runtime.guards import KindGuard
from .runtime.model import ModelSpec, ParamSpec, SubSpec, type_text
from .shapes import dims as D
from .shapes import value_types as T

# A notebook's way to find the variables that hold a value (registered per program by its session).
Namer = Callable[[Any], list[str]]
_NAMERS: weakref.WeakKeyDictionary[Any, Namer] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class DimChange:
    name: str
    then: int
    now: int


@dataclass(frozen=True)
class MemberChange:
    """A change no dim explains: a member added or gone, another dtype or rank, an axis not a bare dim."""
    path: str  # the dotted member, "blocks.w_o"
    then: str
    now: str


@dataclass(frozen=True)
class Staleness:
    """How a model's type changed since the model was made."""
    model: str  # the type's name
    dims: tuple[DimChange, ...]
    members: tuple[MemberChange, ...]

    def made(self) -> str:
        """`made with Hd = 3, but Hd is now 8`, and the member changes no dim explains."""
        parts = []
        if self.dims:
            then = ", ".join(f"{d.name} = {d.then}" for d in self.dims)
            now = (f"{self.dims[0].name} is now {self.dims[0].now}" if len(self.dims) == 1
                   else "they are now " + ", ".join(f"{d.name} = {d.now}" for d in self.dims))
            parts.append(f"made with {then}, but {now}")
        if self.members:
            changes = "; ".join(f"{m.path} was {m.then}, is {m.now} now" for m in self.members)
            parts.append(f"made from an older definition of {self.model} ({changes})")
        return "; it was ".join(parts)


def _member_text(member: ParamSpec | SubSpec | None) -> str:
    if member is None:
        return "not there"
    if isinstance(member, ParamSpec):
        return f"{member.kind} {type_text(member.shape, member.dtype)}"
    return f"[{member.count}] {member.model.name}" if member.count is not None else member.model.name


def _bare_dim(size: D.Dim | None, dim_values: Mapping[str, int | None]) -> str | None:
    """The declared dim an axis (or a stack's count) is, if it is one dim and not arithmetic."""
    if isinstance(size, sympy.Symbol) and not D.is_generic(size) and size.name in dim_values:
        return size.name
    return None


class _Comparison:
    """Walks a model's spec then and the type's spec now side by side, collecting what changed."""

    def __init__(self, dim_values: Mapping[str, int | None]) -> None:
        self.dim_values = dim_values
        self.dims: dict[str, DimChange] = {}
        self.members: list[MemberChange] = []

    def axis(self, size: D.Dim | None, then: int | None, now: int | None, path: str, then_text: str,
             now_text: str) -> None:
        name = _bare_dim(size, self.dim_values)
        seen = self.dims.get(name) if name is not None else None
        if name is not None and then is not None and now is not None and seen in (None, DimChange(name, then, now)):
            self.dims[name] = DimChange(name, then, now)
        else:
            self.members.append(MemberChange(path, then_text, now_text))

    def walk(self, then: ModelSpec, now: ModelSpec, ty: T.ModelT | None, prefix: str = "") -> None:
        old = {m.name: m for m in then.members}
        new = {m.name: m for m in now.members}
        for name in [*new, *(n for n in old if n not in new)]:
            o, n, path = old.get(name), new.get(name), prefix + name
            member = ty.members.get(name) if ty is not None else None
            if isinstance(o, SubSpec) and isinstance(n, SubSpec) and o.model.name == n.model.name:
                if o.count != n.count:
                    self.axis(member.count if member else None, o.count, n.count, path,
                              _member_text(o), _member_text(n))
                self.walk(o.model, n.model, member.model if member else None, path + ".")
            elif isinstance(o, ParamSpec) and isinstance(n, ParamSpec) and (o.kind, o.dtype, len(o.shape)) == (
                    n.kind, n.dtype, len(n.shape)):
                axes = member.tensor.axes if member is not None and member.tensor is not None else ()
                for k, (a, b) in enumerate(zip(o.shape, n.shape)):
                    if a != b:
                        self.axis(axes[k].size if k < len(axes) else None, a, b, path, _member_text(o), _member_text(n))
            else:  # added, gone, or another kind of member
                self.members.append(MemberChange(path, _member_text(o), _member_text(n)))

    def result(self, model: str) -> Staleness | None:
        members = tuple(dict.fromkeys(self.members))  # one line per member, though several axes changed
        if not self.dims and not members:
            return None
        return Staleness(model, tuple(sorted(self.dims.values(), key=lambda d: d.name)), members)


def staleness(then: ModelSpec, program: Any) -> Staleness | None:
    """How `program`'s type of the same name differs in shape from `then` (a model's spec); None if
    it doesn't (an init or a comment may differ: the model still fits the program's functions)."""
    now = program.namespace.get(spec_var(then.name))
    if now is then:
        return None
    if now is None:
        return Staleness(then.name, (), (MemberChange(then.name, "a model type", "not in the program"),))
    comparison = _Comparison(program.checked.dim_values)
    comparison.walk(then, now, program.checked.models.get(then.name))
    return comparison.result(then.name)


# -- refusing stale models at a call ---------------------------------------------------------------

def name_holders(program: Any, namer: Namer) -> None:
    """Let `program`'s guards name the variables that hold a stale model (a notebook's namespace)."""
    _NAMERS[program] = namer


def _held_in(program: Any, *values: Any) -> str:
    namer = _NAMERS.get(program)
    names = list(dict.fromkeys(n for v in values for n in namer(v))) if namer is not None else []
    return f" (in {' and '.join(f'`{n}`' for n in names)})" if names else ""


@dataclass
class CurrentModelGuard:
    """A model or optimizer parameter's KindGuard, and then a check that the model has the shapes its
    type has in this program. The same spec passes at once; another one equal in shapes is
    remembered (a notebook's every cell makes new specs), so a call compares each spec once."""
    kind_guard: KindGuard
    spec: ModelSpec
    program: Any
    fitting: dict[int, ModelSpec] = field(default_factory=dict)  # by id; held, so no id is reused

    def __call__(self, value: Any, bindings: Any) -> Any:
        value = self.kind_guard(value, bindings)
        model = value.model if self.kind_guard.kind == "optimizer" else value
        spec = model.spec
        if spec is not self.spec and id(spec) not in self.fitting:
            changed = staleness(spec, self.program)
            if changed is not None:
                raise ShapeError(self._message(changed, model, value))
            self.fitting[id(spec)] = spec
        return value

    def _message(self, changed: Staleness, model: Any, value: Any) -> str:
        name = changed.model
        what = f"the {name} passed" if value is model else f"the {name} of the optimizer passed"
        return f"{self.kind_guard.param}: {what}{_held_in(self.program, value)} was {changed.made()}; {_remedy(name)}"


def current_models(program: Any, guards: tuple[Any, ...]) -> tuple[Any, ...]:
    """A function's argument guards (the built module's GUARDS entry), each model or optimizer
    parameter's also checking that the model is of this program's shapes."""
    return tuple(CurrentModelGuard(g, program.namespace[spec_var(g.model)], program)
                 if isinstance(g, KindGuard) and g.kind in ("model", "optimizer") and g.model is not None else g
                 for g in guards)


def read_refusal(spec: ModelSpec, member: str, program: Any) -> str | None:
    """Why reading `member` of a model of spec `spec` is refused in `program`, whose type of that
    name has other shapes now (None: it hasn't): the words a call's refusal has."""
    changed = staleness(spec, program)
    if changed is None:
        return None
    name = changed.model
    return (f"reading `{member}`: this {name} was {changed.made()}, so its fields have the old shapes; "
            f"{_remedy(name)} (its old values: .state_dict())")


def _remedy(name: str) -> str:
    """What a stale model's refusals (a call's, a read's) say to do."""
    return f"make it again ({name}.init(seed=...)) or restore a checkpoint"


# -- a notebook cell's notes -----------------------------------------------------------------------

def stale_notes(program: Any, values: Mapping[str, Any], is_model: Callable[[Any], bool],
                skip: set[str], before: Any) -> list[str]:
    """A note for each model among `values` (a notebook's variables) that fitted the program `before`
    this cell and is stale in `program` after it, whose type isn't in `skip` (the model blocks the
    cell changed, which have their own note), naming every variable that holds it or an optimizer
    of it. A model stale already is not said again at every cell (nor after a reset: no `before`)."""
    holders: dict[int, tuple[Any, list[str]]] = {}
    for name, value in values.items():
        if not name.startswith("_") and is_model(value) and value.spec.name not in skip:
            holders.setdefault(id(value), (value, []))[1].append(name)
    notes = []
    for model, names in holders.values():
        changed = staleness(model.spec, program)
        if changed is None or before is None or staleness(model.spec, before) is not None:
            continue
        optimizers = [n for n, v in values.items() if not n.startswith("_") and getattr(v, "model", None) is model]
        also = f"; {', '.join(f'`{n}`' for n in optimizers)} holds an optimizer of it" if optimizers else ""
        remake = f"`{names[0]} = {changed.model}.init(seed=0)`" + (", then its optimizer" if optimizers else "")
        notes.append(f"The {changed.model} in {' and '.join(f'`{n}`' for n in names)} was {changed.made()}{also}: "
                     f"make it again ({remake}) or restore a checkpoint.")
    return notes
