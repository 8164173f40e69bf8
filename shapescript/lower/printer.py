"""Function bodies printed from the IR: each statement one line of Python on torch.

Nothing here looks at the syntax tree or the checker's tables: every type, resolved call, option,
broadcast placing and batch-split mark is on the IR node being printed.
"""

from __future__ import annotations

import keyword
from typing import Protocol

from ..errors import Span
from ..ir import nodes as N
from ..names import MEMBER_PREFIX, spec_var
from ..ops import OPS, LowerCall
from ..shapes import value_types as T
from ..shapes.options import NO_OPTIONS, NO_RECIPE
from ..shapes.plans import Combine, HeadsKind
from .text import literal
from .type_checks import TypeChecks

# Names the generated module binds itself, or calls: a user's name among them is renamed.
RESERVED = {"torch", "_F", "_rt", "annotations", "types", "sys", "getattr", "tuple", "float",
            "DIMS", "DEVICE", "SHARD_PARAMS", "HEAD_PARAMS", "GUARDS", "PYTHON_RESULTS", "EXTERN_TARGETS", "RECORDABLE", "SS_FILE", "SS_LINES", "RUNTIME_SOURCE"}


def py_name(name: str) -> str:
    """A .ss name as a Python identifier that can't clash with Python or the module's own names.
    Renamed names start with `ss_`, and so does every name that is renamed: no two names meet."""
    if (keyword.iskeyword(name) or name in RESERVED or name.startswith(("_", "ss_"))
            or name.endswith("_spec")):
        return f"ss_{name}"
    return name


def placing_text(placing: N.Placing | None) -> str:
    """The index that places a broadcast operand's axes among the result's (`[:, None]`)."""
    if not placing:
        return ""
    return "[" + ", ".join(":" if i == ":" else "None" for i in placing) + "]"


def _needs_parentheses(node: N.Expr | None) -> bool:
    """An operand printed as an operator expression; a product printed as a call needs none."""
    if isinstance(node, N.BinOp) and node.op == "@":
        return not (node.across or node.recipe.tensordot or _rows_by_matrix(node.left.ty, node.right.ty))
    return isinstance(node, (N.BinOp, N.UnOp))


def _rows_by_matrix(left: T.Ty | None, right: T.Ty | None) -> bool:
    """`[.. k] @ [k n]` of f32 tensors: a product runtime/products.py may send to another library."""
    return (isinstance(left, T.TensorT) and isinstance(right, T.TensorT) and left.dtype == right.dtype == "f32"
            and left.rank >= 2 and right.rank == 2)


def size_text(source: object) -> str:
    """A dim's size at run time: a number, or the local that holds what a parameter's shape said."""
    if isinstance(source, int):
        return str(source)
    assert isinstance(source, tuple)
    param, axis = source
    return f"_size_{py_name(param)}_{axis}"


class Emit(Protocol):
    def __call__(self, text: str, span: Span | None = None, indent: int = 0) -> None: ...


class BodyPrinter:
    """Prints one function of the IR through `emit`, which numbers lines and maps them to .ss spans."""

    def __init__(self, emit: Emit, several: bool, type_checks: TypeChecks | None, controller: bool = False) -> None:
        self.emit, self.several, self.type_checks = emit, several, type_checks
        self.controller = controller  # printing the controller's module of a program on several devices
        self.scaled = False  # `precision mixed f16`: value_and_grad scales the loss (runtime/loss_scale.py)

    def function(self, fn: N.Function) -> None:
        names = [py_name(p.name) for p in fn.params]
        self.emit(f"def {py_name(fn.name)}({', '.join(names)}):", fn.span)
        for line in self.type_checks.prologue(fn.params, names) if self.type_checks else ():
            self.emit(line, indent=1)
        split = fn.split if fn.split is not None and fn.split.heads else None
        for source in fn.sizes:  # read before the body can rebind the parameter
            param, axis = source
            read = f"{py_name(param)}.size" if axis == "size" else f"{py_name(param)}.shape[{axis}]"
            if split is not None and any(k == axis and p.name == param for k, p in zip(split.params, fn.params)):
                read += " * _rt.world()"  # each device holds its part of H: the whole axis is N parts
            self.emit(f"{size_text(source)} = {read}", indent=1)
        if not fn.body:
            self.emit("pass", indent=1)
        self.block(fn.body, 1)

    def block(self, body: tuple[N.Stmt, ...], indent: int) -> None:
        for s in body:
            self.stmt(s, indent)

    def stmt(self, s: N.Stmt, indent: int) -> None:
        if isinstance(s, N.Assign):
            self.emit(f"{', '.join(py_name(t.name) for t in s.targets)} = {self.expr(s.value)}", s.span, indent)
        elif isinstance(s, N.Return):
            self.emit("return" if s.value is None else f"return {self.expr(s.value)}", s.span, indent)
        elif isinstance(s, N.For):
            iterable = self.expr(s.iter)
            if self.type_checks is not None:
                iterable = self.type_checks.loop(s.var.ty, iterable)
            self.emit(f"for {py_name(s.var.name)} in {iterable}:", s.span, indent)
            self.block(s.body, indent + 1)
            if not s.body:
                self.emit("pass", indent=indent + 1)
        elif isinstance(s, N.If):
            self.emit(f"if {self.expr(s.cond)}:", s.span, indent)
            self.block(s.then, indent + 1)
            if s.orelse:
                self.emit("else:", indent=indent)
                self.block(s.orelse, indent + 1)
        else:
            assert isinstance(s, N.Do)
            self.emit(self.expr(s.expr), s.span, indent)

    # ---- expressions --------------------------------------------------------------------------

    def expr(self, node: N.Expr, nested: bool = False) -> str:
        text = self._expr(node)
        if self.type_checks is not None:
            text = self.type_checks.wrap(node.ty, node.span, text)
        if nested and _needs_parentheses(node):
            return f"({text})"
        return text

    def _expr(self, node: N.Expr) -> str:
        if isinstance(node, N.Name):
            return py_name(node.id)
        if isinstance(node, N.Size):
            return size_text(node.source)
        if isinstance(node, N.Const):
            if isinstance(node.value, float) and node.value in (float("inf"), float("-inf")):
                return 'float("inf")'
            return literal(node.value)
        if isinstance(node, N.Member):
            obj = self.expr(node.obj, nested=True)
            if node.gathered:  # each device's piece, gathered into the whole param
                return f"_rt.gather_param({obj}, {literal(MEMBER_PREFIX + node.name)}, {literal(str(node.span))})"
            if isinstance(node.obj.ty, T.GradT):  # a param's gradient, or a sub-model's gradients
                return f"_rt.grad_field({obj}, {literal(node.name)}, {literal(str(node.span))})"
            if node.live:  # the live tensor; `m.w` from Python is a copy
                return f"{obj}.{MEMBER_PREFIX}{node.name}"
            if keyword.iskeyword(node.name):
                return f"getattr({obj}, {node.name!r})"
            return f"{obj}.{node.name}"
        if isinstance(node, N.TupleOf):
            return "(" + ", ".join(self.expr(i) for i in node.items) + ",)"
        if isinstance(node, N.Heads):
            return self.heads(node)
        if isinstance(node, N.BinOp):
            return self.binary(node)
        if isinstance(node, N.UnOp):
            operand = self.expr(node.operand, nested=True)
            if node.op == "-":
                return f"-{operand}"
            if isinstance(node.ty, T.TensorT):
                return f"torch.logical_not({operand})"
            return f"not {operand}"
        if isinstance(node, N.OpCall):
            return self.op_call(node)
        if isinstance(node, N.FnCall):
            return self.fn_call(node)
        if isinstance(node, N.GradCall):
            return self.grad_call(node)
        if isinstance(node, N.Attention):
            q, k, v = (self.expr(a) for a in (node.q, node.k, node.v))
            scale = "" if node.scale is None else f", scale={self.expr(node.scale)}"
            return f"_F.scaled_dot_product_attention({q}, {k}, {v}, is_causal=True{scale})"
        if isinstance(node, N.LayerNorm):
            return f"_rt.affine_layer_norm({self.expr(node.x)}, {self.expr(node.gain)}, {self.expr(node.bias)})"
        if isinstance(node, N.CausalMask):
            return f"_rt.causal_mask({', '.join(size_text(s) for s in node.sizes)}, DEVICE)"
        raise AssertionError(f"can't lower {node!r}")

    def fn_call(self, node: N.FnCall) -> str:
        """A call of one of the module's fns (lower/recording.py's printer sends some through the recorder)."""
        # A result the controller's loop only logs: sent without waiting (parallel/pipeline.py).
        later = ".later" if node.later and self.controller and self.type_checks is None else ""
        return f"{py_name(node.name)}{later}({', '.join(self.passed(node.args))})"

    def passed(self, args: tuple[N.Expr, ...]) -> list[str]:
        """A call's arguments; an axis (an `Axis[...]` parameter's) as its index."""
        return [str(a.index) if isinstance(a, N.AxisArg) else self.expr(a) for a in args]

    def binary(self, node: N.BinOp) -> str:
        left = self.expr(node.left, nested=True) + placing_text(node.recipe.left)
        right = self.expr(node.right, nested=True) + placing_text(node.recipe.right)
        if node.op in ("and", "or"):
            tensor = isinstance(node.ty, T.TensorT)
            return f"torch.logical_{node.op}({left}, {right})" if tensor else f"{left} {node.op} {right}"
        if node.op == "@" and node.recipe.tensordot:
            text = f"torch.tensordot({left}, {right}, dims=1)"
        elif node.op == "@" and _rows_by_matrix(node.left.ty, node.right.ty):
            text = f"_rt.matmul({left}, {right})"  # the library that is quicker for its sizes (runtime/products.py)
        else:
            text = f"{left} {node.op} {right}"
        if node.across:  # contracts the batch axis: each device's part is a partial sum
            return f"_rt.all_sum({text}, {literal(str(node.span))})"
        return text

    def heads(self, node: N.Heads) -> str:
        """`split H`: a value gathered whole, cut to this device's heads, or its partial sums added up."""
        value, where = self.expr(node.value), literal(str(node.span))
        if node.kind == HeadsKind.GATHER:
            return f"_rt.gather_heads({value}, {node.axes[0]}, {where})"
        if node.kind == HeadsKind.CUT:
            return f"_rt.cut_heads({value}, {literal(node.axes if len(node.axes) > 1 else node.axes[0])}, {where})"
        return f"_rt.all_sum({value}, {where})"

    def op_call(self, node: N.OpCall) -> str:
        """The op table's lowering, or its all-reduce on several devices."""
        args = ["" if a is None else self.expr(a) for a in node.args]
        # An argument that gets an index or a method call after it needs its own parentheses.
        wrapped = [f"({text})" if _needs_parentheses(a) else text for text, a in zip(args, node.args)]

        def place(k: int, index: N.Placing | None) -> str:
            return wrapped[k] + placing_text(index) if index else args[k]

        call = LowerCall(args, wrapped, node.options, literal(str(node.span)), place, node.recipe, size_text, literal,
                         spec_var)
        op = OPS[node.op]
        if node.across == Combine.PARTIAL:  # every device's result is a partial sum
            return f"_rt.all_sum({op.lower(call)}, {call.where})"
        if node.across == Combine.OWN:
            assert op.across.lower is not None  # the op table's entries say so (tests/compiler/test_op_table.py)
            return op.across.lower(call)
        return op.lower(call)

    def grad_call(self, node: N.GradCall) -> str:
        """value_and_grad, by its op's entry in the table: the function it differentiates, then that
        function's arguments. On several devices it always works across the batch axis (every
        device's gradients are added up), and its entry's lowering for that says where it is."""
        args = [py_name(node.fn)] + self.passed(node.args) + (["sync=False"] if node.deferred else []) + \
            (["scaled=True"] if self.scaled else [])
        call = LowerCall(args, args, NO_OPTIONS, literal(str(node.span)), lambda k, index: args[k], NO_RECIPE,
                         size_text, literal, spec_var)
        op = OPS[node.op]
        lower = op.across.lower if self.several else None
        return (lower or op.lower)(call)
