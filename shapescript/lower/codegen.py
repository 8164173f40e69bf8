"""Lowering: the typed IR of a checked program to readable Python source on torch.

Every statement's line ends with a comment naming its .ss location, and the module carries a
table from its own line numbers to .ss spans, so a run-time error can name the .ss line. Shapes
are not re-derived here: axes, broadcasts and resolved calls are on the IR's nodes.
"""

from __future__ import annotations

from ..check.program import Checked, FnInfo
from ..errors import CompileError, Diagnostic, Span
from ..ir import nodes as ir
from ..syntax import ast as A
from . import guards, specs, targets
from .targets import Target, target_for
from .printer import BodyPrinter, py_name
from .recording import RECORD_IMPORT, RecordingPrinter, recordable, recorded_calls
from .specs import spec_var
from .type_checks import IMPORT as TYPE_CHECKS_IMPORT, TypeChecks
from .text import comment_text, literal


def generate(checked: Checked, module: ir.Module, target: Target | None = None, *, standalone: bool = False,
             check_types: bool = False) -> str:
    """The Python source of `module`, the typed IR of `checked`, for `target` (lower/targets.py;
    `standalone=True` is Target.STANDALONE, and the default one device's module). `check_types`: a
    debug build that checks every value against its checked type as it is computed
    (runtime/typecheck.py, which it imports from shapescript, standalone or not). The pipeline
    (shapescript/pipeline.py) runs the stages before this one."""
    target = target_for(checked, target, standalone)
    unsized = [item for item in checked.program.items
               if isinstance(item, A.Dim) and item.expr is None and checked.dim_values.get(item.name) is None]
    if unsized:
        raise CompileError([Diagnostic(
            "E0313", f"dim `{d.name}` has no size", d.span, "no size",
            (f"give it when loading: ss.load(..., dims={{\"{d.name}\": 65}}), or `--dim {d.name}=65`",))
            for d in unsized], checked.source)
    return _Writer(checked, module, target, TypeChecks(checked) if check_types else None).module()


class _Writer:
    def __init__(self, checked: Checked, module: ir.Module, target: Target,
                 type_checks: TypeChecks | None = None) -> None:
        self.c, self.ir = checked, module
        self.target = target
        self.type_checks = type_checks
        self.lines: list[str] = []
        self.where: dict[int, tuple[int, int]] = {}  # python line -> .ss (line, col)
        # A cuda device's module records its steps: a loop's calls of them go through the recorder
        self.recording = checked.device_set.kind == "cuda" and target in (Target.ONE_DEVICE, Target.WORKER)
        self.recorded_calls = recorded_calls(module) if self.recording else {}

    def emit(self, text: str, node: A.Node | None = None, indent: int = 0) -> None:
        self.emit_at(text, None if node is None else node.span, indent)

    def module(self) -> str:
        c = self.c
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
        self.emit(f"DIMS = {literal(dict(c.dim_values))}")
        self.emit(f"DEVICE = {literal(device_of(c))}  # where tensors live; the loader may set it")
        if self.target is Target.WORKER and c.device_set.shard_params:
            self.emit("SHARD_PARAMS = True  # each worker holds a piece of every param (`shard params`)")
        if self.target is Target.WORKER and c.layout.heads:
            self.emit(f"HEAD_PARAMS = {literal(dict(c.layout.head_params))}  # (model, param): the axis split along "
                      f"{c.layout.heads}")
        if self.target is Target.CONTROLLER:
            for line in targets.CONTROLLER_RUNTIME:
                self.emit(line)
        self.result_checks()
        for data in c.data.values():
            self.emit(f"{spec_var(data.name)} = {specs.data_spec(c, data)}")
        for model in specs.model_order(c):
            self.emit(f"{spec_var(model.name)} = {specs.model_spec(c, model)}")
        self.argument_guards()
        for fn in c.fns.values():
            self.emit("")
            self.emit("")
            if targets.is_remote(c, fn, self.target):  # the controller calls it on the workers
                self.emit(targets.remote_stub(c, fn, py_name(fn.name)), fn.node)
            else:
                self.function(fn)
        self.emit("")
        self.emit("")
        externs = [(n.target.rpartition(".")[0], n.target.rpartition(".")[2], str(n.span))
                   for n in (f.node for f in c.fns.values() if f.kind == "extern") if isinstance(n, A.Extern)]
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
        for fn in self.c.fns.values():
            checks = tuple(guards.param_guard(self.c, fn, k) for k in range(len(fn.params)))
            self.emit(f"{literal(fn.name)}: {guards.source(checks)},", indent=1)
        self.emit("}")

    def result_checks(self) -> None:
        """Each python and extern fn's result checked against its declared type, printed here so
        that the check runs wherever this module runs: in the controller, on the workers, standalone."""
        checks = {fn.name: guards.result_check(self.c, fn) for fn in self.c.fns.values()
                  if fn.kind in ("python", "extern")}
        self.emit("PYTHON_RESULTS = {  # python and extern fns' results, checked against their declared types")
        for name, check in checks.items():
            if check is not None:
                self.emit(f"{literal(name)}: {guards.source(check)},", indent=1)
        self.emit("}")

    # ---- functions and statements -------------------------------------------------------------

    def function(self, fn: FnInfo) -> None:
        params = ", ".join(py_name(p.name) for p in fn.params)
        node = fn.node
        if isinstance(node, A.Extern):
            module, _, attr = node.target.rpartition(".")
            self.emit(f"def {py_name(fn.name)}({params}):", node)
            self.emit(f"# {fn.kind} fn: calls {comment_text(literal(node.target))}", indent=1)
            args = f"({params}{',' if len(fn.params) == 1 else ''})"
            self.emit(f"return _rt.python_call({literal(module)}, {literal(attr)}, {args}, PYTHON_RESULTS.get("
                      f"{literal(fn.name)}), {literal(str(node.span))})", node, 1)
            return
        through = self.recorded_calls.get(fn.name)
        printer = BodyPrinter(self.emit_at, self.c.device_set.count > 1, self.type_checks,
                              self.target is Target.CONTROLLER) if through is None else \
            RecordingPrinter(through, self.emit_at, self.c.device_set.count > 1, self.type_checks)
        printer.function(self.ir.function(fn.name))

    def emit_at(self, text: str, span: Span | None = None, indent: int = 0) -> None:
        line = "    " * indent + text
        if span is not None:
            self.where[len(self.lines) + 1] = (span.line, span.col)
            line += f"  # {comment_text(str(span))}"
        self.lines.append(line)


def device_of(c: Checked) -> str:
    """The torch device of a one-device program: `cpu`, or `cuda:N` for `devices cuda[N]`."""
    d = c.device_set
    if d.kind == "cpu" or d.count > 1:  # on several devices the controller's tensors are on its CPU
        return "cpu"
    return f"cuda:{d.indices[0] if d.indices else 0}"

