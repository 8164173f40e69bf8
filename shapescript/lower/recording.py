"""Which functions a cuda device may record as CUDA graphs (runtime/recorded.py): the module's
`RECORDABLE` table, decided here from the checked program rather than guessed at run time.

A recorded step replays the device's work and nothing else, so a function is recordable only if
its whole step is device work that the same arguments' shapes make the same every time: it runs
on the devices (it uses tensors), and neither it nor any function it calls takes or makes a Mode
(dropout counts its draws in Python), branches on a tensor's value, calls a python or extern fn,
or takes or returns anything
but tensors, batches, models, optimizers and plain numbers. What the table can't see (an op that
waits for the device, as `.item()` does) makes the capture fail at run time, and that function
then runs as it always did.
"""

from __future__ import annotations

from ..ir import nodes as N
from ..ir.walk import statements, walk
from ..shapes import value_types as T
from ..shapes.kinds import CallKind, FnKind
from ..shapes.plans import Where
from .printer import BodyPrinter, Emit, py_name
from .text import literal
from .type_checks import TypeChecks

# The types a recorded step may take from its caller: each is tensors the graph reads or changes in
# place, or a plain value that is part of the step's signature.
_TAKES = (T.TensorT, T.BatchT, T.ModelT, T.OptT, T.ScalarT)


def _plain_result(ty: T.Ty) -> bool:
    """Whether a result can be handed back as copies of the graph's output tensors."""
    if isinstance(ty, T.TupleT):
        return all(_plain_result(item) for item in ty.items)
    return isinstance(ty, (T.TensorT, T.ScalarT, T.NoneT))


def _entry(fn: N.Function) -> bool:
    """Whether `fn` can be called as a recorded step: device work, taking and giving plain values."""
    return (fn.placement.where == Where.WORKERS and all(isinstance(p.ty, _TAKES) for p in fn.params)
            and _plain_result(fn.ret))


def _only_device_work(fn: N.Function) -> bool:
    """Whether `fn`'s own body does nothing a replay would skip (its callees are looked at apart)."""
    if fn.kind != FnKind.FN:
        return False
    if any(isinstance(s, N.If) and isinstance(s.cond.ty, T.TensorT) for s in statements(fn.body)):
        return False  # a branch on a tensor's value reads it back: a replay would take the captured branch
    return not any(e.ty == T.MODE or (isinstance(e, N.FnCall) and e.kind != CallKind.FN) for e in walk(fn.body))


def _callees(fn: N.Function) -> set[str]:
    found = set()
    for e in walk(fn.body):
        if isinstance(e, N.FnCall):
            found.add(e.name)
        elif isinstance(e, N.GradCall):
            found.add(e.fn)
    return found


def _recordable(module: N.Module) -> list[str]:
    """The .ss names of the functions whose steps may be recorded, in the module's order. None under
    `precision mixed f16`: a step reads whether its gradients overflowed on the host, which a CUDA
    graph can't."""
    if module.mixed == "f16":
        return []
    fns = {fn.name: fn for fn in module.functions}
    ruled_out = {name for name, fn in fns.items() if not _only_device_work(fn)}
    changed = True
    while changed:  # a caller of a function ruled out is ruled out
        changed = False
        for name, fn in fns.items():
            if name not in ruled_out and any(c not in fns or c in ruled_out for c in _callees(fn)):
                ruled_out.add(name)
                changed = True
    return [name for name, fn in fns.items() if name not in ruled_out and _entry(fn)]


def recordable(module: N.Module) -> tuple[str, ...]:
    """The Python names of `module`'s functions whose steps may be recorded (as the module binds them,
    and as the workers' calls and api.Function look them up), in the module's order."""
    return tuple(py_name(name) for name in _recordable(module))


def recorded_calls(module: N.Module) -> dict[str, frozenset[str]]:
    """By caller, the recordable functions whose calls it makes go through the device's recorder:
    a loop's `train_step(...)` in `run` records as a call from Python does. Only a caller that no
    recordable function runs, directly or through others, wraps its calls: a step's own calls
    (train_step's `loss`, loss's `forward`) run inside its capture."""
    fns = {fn.name: fn for fn in module.functions}
    entries = set(_recordable(module))
    inside, todo = set(entries), list(entries)
    while todo:  # every function some recorded step may run
        for callee in _callees(fns[todo.pop()]):
            if callee in fns and callee not in inside:
                inside.add(callee)
                todo.append(callee)
    # Plain calls only: value_and_grad(loss, ...) runs `loss` under autograd, not as a step
    calls = {name: frozenset(e.name for e in walk(fn.body) if isinstance(e, N.FnCall) and e.name in entries)
             for name, fn in fns.items() if name not in inside and fn.kind == FnKind.FN}
    return {name: callees for name, callees in calls.items() if callees}


RECORD_IMPORT = "from shapescript.runtime import recorded as _recorded"  # printed where a call is wrapped


class RecordingPrinter(BodyPrinter):
    """A function's body in which each call of `through` goes through the recorder of the module's
    DEVICE (runtime/recorded.step), named as the module binds the function, as the report says it."""

    def __init__(self, through: frozenset[str], emit: Emit, several: bool, type_checks: TypeChecks | None) -> None:
        super().__init__(emit, several, type_checks)
        self.through = through

    def fn_call(self, node: N.FnCall) -> str:
        if node.name not in self.through:
            return super().fn_call(node)
        name, args = py_name(node.name), self.passed(node.args)
        values = f"({', '.join(args)}{',' if len(args) == 1 else ''})"
        return f"_recorded.step(DEVICE, {literal(name)}, {name}, {values})"
