"""Lowering: a `Checked` program to readable Python source on torch.

Every statement's line ends with a comment naming its .ss location, and the module carries a
table from its own line numbers to .ss spans, so a run-time error can name the .ss line. Shapes
are not re-derived here: axes, broadcasts and resolved calls come from the checker's tables.
"""

from __future__ import annotations

import keyword

from ..check import types as T
from ..check.ops import OPS, LowerCall
from ..check.program import Checked, FnInfo
from ..errors import CompileError, Diagnostic
from ..names import MEMBER_PREFIX
from ..syntax import ast as A
from . import guards, specs
from .type_checks import IMPORT as TYPE_CHECKS_IMPORT, TypeChecks
from .text import comment_text, literal

COMPARE = {"==", "!=", "<", "<=", ">", ">="}
# Built-ins given dims whose sizes they read when they run (their calls' `sizes` option).
RUNTIME_CALLS = {"update": "_rt.update", "shuffle": "_rt.shuffle", "print": "_rt.show",
                 "write": "_rt.write", "save": "_rt.save", "load": "_rt.load"}
# Names the generated module binds itself, or calls: a user's name among them is renamed.
RESERVED = {"torch", "_F", "_rt", "annotations", "types", "sys", "getattr", "tuple", "float",
            "DIMS", "DEVICE", "PYTHON_RESULTS", "EXTERN_TARGETS", "SS_FILE", "SS_LINES", "RUNTIME_SOURCE"}
# Built-ins that lower to one call: the arguments' texts by position, the call's options by name.
TEMPLATES = {"Train": "_rt.Train({0})", "Eval": "_rt.Eval"}


def py_name(name: str) -> str:
    """A .ss name as a Python identifier that can't clash with Python or the module's own names.
    Renamed names start with `ss_`, and so does every name that is renamed: no two names meet."""
    if (keyword.iskeyword(name) or name in RESERVED or name.startswith(("_", "ss_"))
            or name.endswith("_spec")):
        return f"ss_{name}"
    return name


def generate(checked: Checked, standalone: bool = False, check_types: bool = False) -> str:
    """The module's source. `check_types`: a debug build that checks every value against its checked
    type as it is computed (runtime/typecheck.py, which it imports from shapescript, standalone or not)."""
    if standalone and checked.device_set.count > 1:
        span = checked.program.items[0].span if checked.program.items else checked.program.span
        raise CompileError([Diagnostic(
            "E1805", f"a standalone build can't run on {checked.device_set.count} devices", span,
            "several devices", ("build without --standalone, or for one device",),
            ("on several devices the program runs in a controller that starts the package's workers",))],
            checked.source)
    unsized = [item for item in checked.program.items
               if isinstance(item, A.Dim) and item.expr is None and checked.dim_values.get(item.name) is None]
    if unsized:
        raise CompileError([Diagnostic(
            "E0313", f"dim `{d.name}` has no size", d.span, "no size",
            (f"give it when loading: ss.load(..., dims={{\"{d.name}\": 65}}), or `--dim {d.name}=65`",))
            for d in unsized], checked.source)
    return _Writer(checked, standalone, TypeChecks(checked) if check_types else None).module()


class _Writer:
    def __init__(self, checked: Checked, standalone: bool, type_checks: TypeChecks | None = None) -> None:
        self.c = checked
        self.standalone = standalone
        self.type_checks = type_checks
        self.lines: list[str] = []
        self.where: dict[int, tuple[int, int]] = {}  # python line -> .ss (line, col)

    def emit(self, text: str, node: A.Node | None = None, indent: int = 0) -> None:
        line = "    " * indent + text
        if node is not None:
            self.where[len(self.lines) + 1] = (node.span.line, node.span.col)
            line += f"  # {comment_text(str(node.span))}"
        self.lines.append(line)

    def module(self) -> str:
        c = self.c
        # The docstring, as a literal: the file's name is the user's text (and line 1 is never a comment,
        # so no name can make it an encoding declaration).
        self.emit(literal(f"Built by ShapeScript from {c.file}; each line names the .ss source it comes from."))
        self.emit("from __future__ import annotations")
        self.emit("import torch")
        self.emit("import torch.nn.functional as _F")
        if self.standalone:  # the runtime, in a module of its own so that none of its names meets ours
            self.emit("import sys")
            self.emit("import types")
            self.emit("")
            self.emit(f"RUNTIME_SOURCE = {literal(specs.standalone_prelude())}")
            self.emit('_rt = types.ModuleType(__name__ + "._rt")')
            self.emit("sys.modules[_rt.__name__] = _rt  # dataclasses look their module up there")
            self.emit('exec(compile(RUNTIME_SOURCE, "<shapescript runtime>", "exec"), _rt.__dict__)')
        else:
            self.emit("from shapescript.runtime import core as _rt")
        if self.type_checks is not None:
            self.emit(TYPE_CHECKS_IMPORT)
        self.emit("")
        self.emit(f"DIMS = {literal(dict(c.dim_values))}")
        self.emit(f"DEVICE = {literal(device_of(c))}  # where tensors live; the loader may set it")
        self.result_checks()
        for data in c.data.values():
            self.emit(f"{spec_var(data.name)} = {specs.data_spec(c, data)}")
        for model in specs.model_order(c):
            self.emit(f"{spec_var(model.name)} = {specs.model_spec(c, model)}")
        for fn in c.fns.values():
            self.emit("")
            self.emit("")
            self.function(fn)
        self.emit("")
        self.emit("")
        externs = [(n.target.rpartition(".")[0], n.target.rpartition(".")[2], str(n.span))
                   for n in (f.node for f in c.fns.values() if f.kind == "extern")]
        self.emit(f"EXTERN_TARGETS = {literal(externs)}  # imported by each worker as the program loads")
        self.emit(f"SS_FILE = {literal(c.file)}")
        self.emit(f"SS_LINES = {literal(self.where)}")
        return "\n".join(self.lines) + "\n"

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
        self.emit(f"def {py_name(fn.name)}({params}):", node)
        for line in self.type_checks.prologue(fn, [py_name(p.name) for p in fn.params]) if self.type_checks else ():
            self.emit(line, indent=1)
        for source in self.sizes_used(node):  # read before the body can rebind the parameter
            param, axis = source
            read = f"{py_name(param)}.size" if axis == "size" else f"{py_name(param)}.shape[{axis}]"
            self.emit(f"{self.size_text(source)} = {read}", indent=1)
        body = node.body
        if not body:
            self.emit("pass", indent=1)
        self.block(body, 1)

    def block(self, body: list[A.Stmt], indent: int) -> None:
        for s in body:
            self.stmt(s, indent)

    def stmt(self, s: A.Stmt, indent: int) -> None:
        if isinstance(s, A.Assign):
            targets = ", ".join(py_name(t.id) for t in s.targets)
            self.emit(f"{targets} = {self.expr(s.value)}", s, indent)
        elif isinstance(s, A.Return):
            self.emit("return" if s.value is None else f"return {self.expr(s.value)}", s, indent)
        elif isinstance(s, A.For):
            iterable = self.expr(s.iter)
            if self.type_checks is not None:
                iterable = self.type_checks.loop(s, iterable)
            self.emit(f"for {py_name(s.var.id)} in {iterable}:", s, indent)
            self.block(s.body, indent + 1)
            if not s.body:
                self.emit("pass", indent=indent + 1)
        else:
            self.emit(self.expr(s.expr), s, indent)

    # ---- expressions --------------------------------------------------------------------------

    def expr(self, node: A.Expr, nested: bool = False) -> str:
        text = self._expr(node)
        if self.type_checks is not None:
            text = self.type_checks.wrap(node, text)
        if nested and isinstance(node, (A.Binary, A.Unary)):
            return f"({text})"
        return text

    def _expr(self, node: A.Expr) -> str:
        if isinstance(node, A.Name):
            recipe = self.c.recipes.get(id(node))
            return self.size_text(recipe["size"]) if recipe else py_name(node.id)
        if isinstance(node, A.FloatLit) and node.value in (float("inf"), float("-inf")):
            return 'float("inf")'
        if isinstance(node, (A.IntLit, A.FloatLit, A.StrLit)):
            return literal(node.value)
        if isinstance(node, A.BoolLit):
            return "True" if node.value else "False"
        if isinstance(node, A.Attr):
            obj = self.expr(node.obj, nested=True)
            if isinstance(self.c.type_of(node.obj), T.ModelT):  # the live tensor; `m.w` from Python is a copy
                return f"{obj}.{MEMBER_PREFIX}{node.name}"
            if keyword.iskeyword(node.name):
                return f"getattr({obj}, {node.name!r})"
            return f"{obj}.{node.name}"
        if isinstance(node, A.TupleExpr):
            return "(" + ", ".join(self.expr(i) for i in node.items) + ",)"
        if isinstance(node, A.Binary):
            return self.binary(node)
        if isinstance(node, A.Unary):
            operand = self.expr(node.operand, nested=True)
            if node.op == "-":
                return f"-{operand}"
            if isinstance(self.c.type_of(node), T.TensorT):
                return f"torch.logical_not({operand})"
            return f"not {operand}"
        if isinstance(node, A.Call):
            return self.call(node)
        raise AssertionError(f"can't lower {node!r}")

    def binary(self, node: A.Binary) -> str:
        recipe = self.c.recipes.get(id(node), {})
        left = self.expr(node.left, nested=True) + index_text(recipe.get("left"))
        right = self.expr(node.right, nested=True) + index_text(recipe.get("right"))
        tensor = isinstance(self.c.type_of(node), T.TensorT)
        if node.op in ("and", "or"):
            return f"torch.logical_{node.op}({left}, {right})" if tensor else f"{left} {node.op} {right}"
        if node.op == "@" and recipe.get("kind") == "tensordot":
            text = f"torch.tensordot({left}, {right}, dims=1)"
        else:
            text = f"{left} {node.op} {right}"
        if recipe.get("across"):  # contracts the batch axis: each device's part is a partial sum
            return f"_rt.all_sum({text}, {literal(str(node.span))})"
        return text

    def call(self, node: A.Call) -> str:
        info = self.c.calls[id(node)]
        skip = info.options.get("axis_args", {})
        args = ["" if k in skip else self.expr(a) for k, a in enumerate(info.args)]  # type: ignore[arg-type]
        # An argument that gets an index or a method call after it needs its own parentheses.
        self.wrapped = [f"({text})" if isinstance(a, (A.Binary, A.Unary)) else text
                        for text, a in zip(args, info.args)]
        if info.kind in ("fn", "python", "extern"):
            for k, axis in info.options.get("axis_args", {}).items():
                args[k] = str(axis)  # an Axis[...] argument is passed as the axis's index
            return f"{py_name(info.name)}({', '.join(args)})"
        if info.kind == "grad":
            where = f"where={literal(str(node.span))}" if self.c.device_set.count > 1 else ""  # for the workers' reports
            return f"_rt.value_and_grad({', '.join([py_name(info.name)] + args + ([where] if where else []))})"
        name, opts = info.name, info.options
        recipe = self.c.recipes.get(id(node), {})
        across = recipe.get("across")
        op = OPS.get(name)
        if op is not None:  # the op table's lowering, or its all-reduce on several devices
            call = LowerCall(args, self.wrapped, opts, literal(str(node.span)),
                             lambda k, index: self.placed(k, index, args), recipe, self.size_text, literal)
            if across:
                return op.across.lower(call) if op.across.lower else f"_rt.all_sum({op.lower(call)}, {call.where})"
            return op.lower(call)
        if name == "batches":
            return f"_rt.batches({args[0]}, {args[1]}, {spec_var(str(opts['data']))}, DEVICE)"
        if name == "logs":
            if any(keyword.iskeyword(k) for k in opts["names"]):  # e.g. logs(class=x)
                pairs = ", ".join(f"{literal(k)}: {v}" for k, v in zip(opts["names"], args))  # type: ignore
                return f"_rt.logs(**{{{pairs}}})"
            pairs = ", ".join(f"{k}={v}" for k, v in zip(opts["names"], args))  # type: ignore[arg-type]
            return f"_rt.logs({pairs})"
        if name in RUNTIME_CALLS:
            return f"{RUNTIME_CALLS[name]}({', '.join(args)})"
        return self.library_call(node, name, args, opts)

    def library_call(self, node: A.Call, name: str, args: list[str], opts: dict) -> str:
        """The modes, Train(seed=...) and Eval (the op table's ops lower through it)."""
        if name in TEMPLATES:
            return TEMPLATES[name].format(*args, **opts)
        raise AssertionError(f"no lowering for built-in `{name}`")

    def placed(self, k: int, index: tuple | None, args: list[str]) -> str:
        """Argument k, with the index that places its axes among another's, if it needs one."""
        return self.wrapped[k] + index_text(index) if index else args[k]

    def sizes_used(self, fn: A.Fn) -> list[tuple]:
        """The generic dims' sizes a function reads off its parameters (dims as numbers, and the calls
        whose options say which `sizes` they read)."""
        from ..check.split import iter_nodes
        found: list[tuple] = []
        for node in iter_nodes(fn):
            sources = []
            if isinstance(node, A.Name) and "size" in self.c.recipes.get(id(node), {}):
                sources = [self.c.recipes[id(node)]["size"]]
            elif isinstance(node, A.Call) and "sizes" in getattr(self.c.calls.get(id(node)), "options", {}):
                sources = list(self.c.calls[id(node)].options["sizes"])
            found += [s for s in sources if isinstance(s, tuple) and s not in found]
        return found

    @staticmethod
    def size_text(source: object) -> str:
        """A dim's size at run time: a number, or the local that holds what a parameter's shape said."""
        if isinstance(source, int):
            return str(source)
        param, axis = source  # type: ignore[misc]
        return f"_size_{py_name(param)}_{axis}"


def device_of(c: Checked) -> str:
    """The torch device of a one-device program: `cpu`, or `cuda:N` for `devices cuda[N]`."""
    d = c.device_set
    if d.kind == "cpu" or d.count > 1:  # on several devices the controller's tensors are on its CPU
        return "cpu"
    return f"cuda:{d.indices[0] if d.indices else 0}"


def spec_var(name: str) -> str:
    return f"{name}_spec"


def index_text(index: tuple | None) -> str:
    if not index:
        return ""
    return "[" + ", ".join(":" if i == ":" else "None" for i in index) + "]"
