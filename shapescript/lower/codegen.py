"""Lowering: the typed IR of a checked program to readable Python source on torch.

Every statement's line ends with a comment naming its .ss location, and the module carries a
table from its own line numbers to .ss spans, so a run-time error can name the .ss line. Shapes
are not re-derived here: axes, broadcasts and resolved calls are on the IR's nodes.
"""

from __future__ import annotations

from ..devices import DeviceSet
from ..dtypes import ELEMENTS
from ..errors import Span
from ..ir import nodes as ir
from ..names import spec_var
from ..shapes import value_types as T
from ..shapes.kinds import FnKind
from ..shapes.plans import Where
from . import guards, specs, targets
from .printer import BodyPrinter, py_name
from .recording import RECORD_IMPORT, RecordingPrinter, recordable, recorded_calls
from .targets import Target, target_for
from .text import comment_text, literal
from .type_checks import IMPORT as TYPE_CHECKS_IMPORT
from .type_checks import TypeChecks


def generate(module: ir.Module, target: Target | None = None, *, standalone: bool = False,
             check_types: bool = False) -> str:
    """The Python source of `module`, a checked program's typed IR, for `target` (lower/targets.py;
    `standalone=True` is Target.STANDALONE, and the default one device's module). `check_types`: a
    debug build that checks every value against its checked type as it is computed
    (runtime/typecheck.py, which it imports from shapescript, standalone or not). The pipeline
    (shapescript/pipeline.py) runs the stages before this one, and refuses a program with a dim
    still without its size before it gets here."""
    target = target_for(module, target, standalone)
    return _Writer(module, target, TypeChecks(module) if check_types else None).module()


class _Writer:
    def __init__(self, module: ir.Module, target: Target, type_checks: TypeChecks | None = None) -> None:
        self.ir = module
        self.target = target
        self.type_checks = type_checks
        self.lines: list[str] = []
        self.where: dict[int, tuple[int, int]] = {}  # python line -> .ss (line, col)
        # A cuda device's module records its steps: a loop's calls of them go through the recorder
        self.recording = module.devices.kind == "cuda" and target in (Target.ONE_DEVICE, Target.WORKER)
        self.recorded_calls = recorded_calls(module) if self.recording else {}

    def emit(self, text: str, span: Span | None = None, indent: int = 0) -> None:
        self.emit_at(text, span, indent)

    def module(self) -> str:
        c = self.ir
        # The docstring, as a literal: the file's name is the user's text (and line 1 is never a comment,
        # so no name can make it an encoding declaration).
        self.emit(literal(f"Built by ShapeScript from {c.file}; each line names the .ss source it comes from."))
        self.emit("from __future__ import annotations")
        self.emit("import torch")
        self.emit("import torch.nn.functional as _F")
        if self.target is Target.STANDALONE:  # the runtime, in a module of its own: none of its names meets ours
            self.emit("import sys")
            self.emit("import types")
            self.emit("")
            self.emit(f"RUNTIME_SOURCE = {literal(specs.standalone_prelude())}")
            self.emit('_rt = types.ModuleType(__name__ + "._rt")')
            self.emit("sys.modules[_rt.__name__] = _rt  # dataclasses look their module up there")
            self.emit('exec(compile(RUNTIME_SOURCE, "<shapescript runtime>", "exec"), _rt.__dict__)')
        else:
            self.emit("from shapescript.runtime import core as _rt")
            if self.recorded_calls:
                self.emit(RECORD_IMPORT)
        if self.target is Target.CONTROLLER:
            self.emit(targets.REMOTE_IMPORT)
        if self.type_checks is not None:
            self.emit(TYPE_CHECKS_IMPORT)
        self.emit("")
        self.emit(f"DIMS = {literal(dict(c.dims))}")
        self.emit(f"DEVICE = {literal(device_of(c.devices))}  # where tensors live; the loader may set it")
        if self.target is Target.WORKER and c.devices.shard_params:
            self.emit("SHARD_PARAMS = True  # each worker holds a piece of every param (`shard params`)")
        if self.target is Target.WORKER and c.heads:
            self.emit(f"HEAD_PARAMS = {literal(dict(c.head_params))}  # (model, param): the axis split along "
                      f"{c.heads}")
        if self.target is Target.CONTROLLER:
            for line in targets.CONTROLLER_RUNTIME:
                self.emit(line)
        self.result_checks()
        for data in c.data:
            self.emit(f"{spec_var(data.name)} = {specs.data_spec(c, data)}")
        for model in specs.model_order(c):
            self.emit(f"{spec_var(model.name)} = {specs.model_spec(c, model)}")
        self.argument_guards()
        for fn in c.functions:
            self.emit("")
            self.emit("")
            if targets.is_remote(fn, self.target):  # the controller calls it on the workers
                self.emit(targets.remote_stub(fn, py_name(fn.name)), fn.span)
            else:
                self.function(fn)
        self.emit("")
        self.emit("")
        externs = [(f.target.rpartition(".")[0], f.target.rpartition(".")[2], str(f.span))
                   for f in c.functions if f.kind == FnKind.EXTERN]
        if self.recording:
            self.emit(f"RECORDABLE = {literal(recordable(self.ir))}  # fns a cuda device may record as CUDA graphs")
        self.emit(f"EXTERN_TARGETS = {literal(externs)}  # imported by each worker as the program loads")
        self.emit(f"SS_FILE = {literal(c.file)}")
        self.emit(f"SS_LINES = {literal(self.where)}")
        return "\n".join(self.lines) + "\n"

    def argument_guards(self) -> None:
        """Each function's parameters checked as a value comes in from Python: whoever calls the
        module's functions from Python (api.Function) runs these first. After the data specs, which
        the batches' guards name."""
        self.emit("GUARDS = {  # each function's arguments from Python, checked against their declared types")
        for fn in self.ir.functions:
            checks = tuple(guards.param_guard(self.ir, fn, k) for k in range(len(fn.params)))
            self.emit(f"{literal(fn.name)}: {guards.source(checks)},", indent=1)
        self.emit("}")

    def result_checks(self) -> None:
        """Each python and extern fn's result checked against its declared type, printed here so
        that the check runs wherever this module runs: in the controller, on the workers, standalone."""
        checks = {fn.name: guards.result_check(self.ir, fn) for fn in self.ir.functions
                  if fn.kind in (FnKind.PYTHON, FnKind.EXTERN)}
        self.emit("PYTHON_RESULTS = {  # python and extern fns' results, checked against their declared types")
        for name, check in checks.items():
            if check is not None:
                self.emit(f"{literal(name)}: {guards.source(check)},", indent=1)
        self.emit("}")

    # ---- functions and statements -------------------------------------------------------------

    def function(self, fn: ir.Function) -> None:
        params = ", ".join(py_name(p.name) for p in fn.params)
        if fn.kind != FnKind.FN:  # a python or extern fn: a call of its Python function
            module, _, attr = fn.target.rpartition(".")
            self.emit(f"def {py_name(fn.name)}({params}):", fn.span)
            self.emit(f"# {fn.kind} fn: calls {comment_text(literal(fn.target))}", indent=1)
            args = f"({params}{',' if len(fn.params) == 1 else ''})"
            self.emit(f"return _rt.python_call({literal(module)}, {literal(attr)}, {args}, PYTHON_RESULTS.get("
                      f"{literal(fn.name)}), {literal(str(fn.span))})", fn.span, 1)
            return
        if self.ir.mixed is not None and fn.placement.where != Where.CONTROLLER:  # `precision mixed bf16`
            compute = ELEMENTS[self.ir.mixed].torch
            self.emit(f"@_rt.mixed_precision({literal(compute)}, {literal(declared_dtypes(fn.ret))})")
        if self.ir.tf32 and fn.placement.where != Where.CONTROLLER:  # `precision tf32`
            self.emit("@_rt.tf32_products")
        through = self.recorded_calls.get(fn.name)
        several = self.ir.devices.count > 1
        printer = BodyPrinter(self.emit_at, several, self.type_checks, self.target is Target.CONTROLLER) \
            if through is None else RecordingPrinter(through, self.emit_at, several, self.type_checks)
        printer.scaled = self.ir.mixed == "f16"
        printer.function(fn)

    def emit_at(self, text: str, span: Span | None = None, indent: int = 0) -> None:
        line = "    " * indent + text
        if span is not None:
            self.where[len(self.lines) + 1] = (span.line, span.col)
            line += f"  # {comment_text(str(span))}"
        self.lines.append(line)


def declared_dtypes(ty: T.Ty) -> object:
    """A return type's dtypes as `_rt.mixed_precision` takes them: torch's name for a tensor's, a
    tuple of them for a tuple, None for anything else."""
    if isinstance(ty, T.TensorT):
        return ELEMENTS[ty.dtype].torch
    if isinstance(ty, T.TupleT):
        return tuple(declared_dtypes(t) for t in ty.items)
    return None


def device_of(devices: DeviceSet) -> str:
    """The torch device of a one-device program: `cpu`, or `cuda:N` for `devices cuda[N]`."""
    if devices.kind == "cpu" or devices.count > 1:  # on several devices the controller's tensors are on its CPU
        return "cpu"
    return f"cuda:{devices.indices[0] if devices.indices else 0}"
