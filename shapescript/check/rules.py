"""Rules of the built-in functions of training, of the controller's statements and of the modes
(tensor operations are in the op table, check/ops/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..syntax import ast as A
from . import types as T
from .builtins import _unused_args, int_arg, literal_number, rule

if TYPE_CHECKING:
    from .bodies import BodyChecker

# ---- training --------------------------------------------------------------------------------

@rule("value_and_grad")
def value_and_grad(ck: "BodyChecker", node: A.Call) -> T.Ty:
    if not node.args or node.args[0].keyword or not isinstance(node.args[0].value, A.Name) \
            or node.args[0].value.id not in ck.ctx.fns:
        _unused_args(ck, node)
        return ck.error("E0601", "`value_and_grad` takes a function first, then its arguments",
                        node.args[0].span if node.args else node.span, "not a function",
                        "write `value_and_grad(loss, m, batch)`")
    fn = ck.ctx.fns[node.args[0].value.id]
    ck.checked.types[id(node.args[0].value)] = T.FnRefT(fn.name)
    ck.fn.calls.setdefault(fn.name, node.span)
    ck.fn.device_work.append(("value_and_grad", node.span))
    if not fn.params or not isinstance(fn.params[0].ty, T.ModelT):
        _unused_args(ck, node)
        return ck.error("E0601", f"`{fn.name}` must take the model it differentiates as its first parameter",
                        node.args[0].span, "no model first", f"declare `fn {fn.name}(m: Model, ...)`")
    inner = A.Call(node.span, node.args[0].value, node.args[1:])
    result = ck.call_fn(inner, fn)
    ck.checked.calls[id(node)] = ck.checked.calls.pop(id(inner), None) or _none_call(fn.name)
    ck.checked.calls[id(node)].kind = "grad"
    if result is T.UNKNOWN:
        return result
    if not (isinstance(result, T.TensorT) and result.rank == 0 and result.is_float):
        return ck.error("E0601", f"`value_and_grad` needs a function whose result is a float scalar [], "
                        f"but `{fn.name}` returns {result.show()}", node.args[0].span, "not a scalar",
                        "reduce it first, as `mean(x)`")
    return T.TupleT((result, T.GradT(fn.params[0].ty)))


def _none_call(name: str):
    from .program import CallInfo
    return CallInfo("grad", name, [])


@rule("update")
def update(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["model", "opt", "grads"], "`update`")
    if args is None:
        return _unused_args(ck, node)
    m, opt, g = (ck.expr(a.value) for a in args)  # type: ignore[union-attr]
    ck.fn.device_work.append(("update", node.span))
    ck.check_mut(args[0], True, "model", "`update`")  # type: ignore[arg-type]
    ck.check_mut(args[1], True, "opt", "`update`")  # type: ignore[arg-type]
    ck.check_mut(args[2], False, "grads", "`update`")  # type: ignore[arg-type]
    if T.UNKNOWN in (m, opt, g):
        return T.NONE
    if not isinstance(m, T.ModelT):
        return ck.error("E0401", f"`update` changes a model, not {m.show()}", args[0].span,  # type: ignore
                        f"this is {m.show()}")
    if not (isinstance(opt, T.OptT) and opt.model is m):
        return ck.error("E0401", f"`update` needs an optimizer of `{m.name}`, not {opt.show()}",
                        args[1].span, f"this is {opt.show()}", f"declare it `AdamW[{m.name}]`")  # type: ignore
    if not (isinstance(g, T.GradT) and g.model is m):
        return ck.error("E0401", f"`update` needs gradients of `{m.name}`, not {g.show()}", args[2].span,  # type: ignore
                        f"this is {g.show()}", "take them from `value_and_grad`")
    ck.record_call(node, "builtin", "update", [a.value for a in args])  # type: ignore[union-attr]
    return T.NONE


# ---- data, logs and checkpoints (in the controller) -----------------------------------------

@rule("shuffle")
def shuffle(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["data", "seed"], "`shuffle`")
    if args is None:
        return _unused_args(ck, node)
    t = ck.expr(args[0].value)  # type: ignore[union-attr]
    int_arg(ck, args[1], "`shuffle`'s seed")
    ck.use("loop", node.span)
    if not isinstance(t, T.DatasetT):
        return t if t is T.UNKNOWN else ck.error("E0401", f"`shuffle` takes a dataset, not {t.show()}",
                                                 args[0].span, f"this is {t.show()}")  # type: ignore
    ck.record_call(node, "builtin", "shuffle", [a.value for a in args])  # type: ignore[union-attr]
    return t


@rule("batches")
def batches(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["data", "size"], "`batches`")
    if args is None:
        return _unused_args(ck, node)
    t = ck.expr(args[0].value)  # type: ignore[union-attr]
    int_arg(ck, args[1], "a batch's size")
    size = literal_number(args[1].value)  # type: ignore[union-attr]
    if size is not None and size <= 0:
        return ck.error("E0310", f"a batch holds at least one example, not {size}", args[1].span,  # type: ignore
                        "not a size")
    if not isinstance(t, T.DatasetT):
        return t if t is T.UNKNOWN else ck.error("E0401", f"`batches` takes a dataset, not {t.show()}",
                                                 args[0].span, f"this is {t.show()}")  # type: ignore
    ck.record_call(node, "builtin", "batches", [a.value for a in args], data=t.data.name)  # type: ignore
    return T.BatchesT(t.data, size)


@rule("print")
def print_(ck: "BodyChecker", node: A.Call) -> T.Ty:
    for a in node.args:
        if a.keyword or a.mut or isinstance(a.value, A.Pattern):
            ck.error("E0206", "`print` takes values only", a.span, "unexpected here")
            continue
        ck.expr(a.value)
    ck.use("print", node.span)
    ck.record_call(node, "builtin", "print", [a.value for a in node.args])
    return T.NONE


@rule("logs")
def logs(ck: "BodyChecker", node: A.Call) -> T.Ty:
    seen: set[str] = set()
    for a in node.args:
        if not a.keyword:
            ck.error("E0206", "`logs` takes named values, as `logs(loss=l)`", a.span, "no name")
            continue
        if a.keyword in seen:
            ck.error("E0206", f"`{a.keyword}` is logged twice", a.span, "given again")
            continue
        seen.add(a.keyword)
        t = ck.expr(a.value)  # type: ignore[arg-type]
        if not (isinstance(t, (T.TensorT, T.ScalarT)) or t is T.UNKNOWN):
            ck.error("E0401", f"a log holds numbers and tensors, not {t.show()}", a.span, f"this is {t.show()}")
    ck.record_call(node, "builtin", "logs", [a.value for a in node.args],
                   names=[a.keyword for a in node.args])
    return T.LOGS


@rule("write")
def write(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["sink", "record"], "`write`")
    if args is None:
        return _unused_args(ck, node)
    sink, record = (ck.expr(a.value) for a in args)  # type: ignore[union-attr]
    ck.use("write", node.span)
    for arg, t, want in ((args[0], sink, T.SINK), (args[1], record, T.LOGS)):
        if t != want and t is not T.UNKNOWN:
            ck.error("E0401", f"`write` takes a {want.show()} here, not {t.show()}", arg.span,  # type: ignore
                     f"this is {t.show()}", "write(log, logs(loss=l))")
    ck.record_call(node, "builtin", "write", [a.value for a in args])  # type: ignore[union-attr]
    return T.NONE


@rule("save", "load")
def checkpoint(ck: "BodyChecker", node: A.Call) -> T.Ty:
    name = node.func.id  # type: ignore[union-attr]
    args = ck.arrange(node, ["path", "model", "opt"], f"`{name}`", required=2)
    if args is None:
        return _unused_args(ck, node)
    ck.use(name, node.span)
    path = ck.expr(args[0].value)  # type: ignore[union-attr]
    if path != T.STR and path is not T.UNKNOWN:
        ck.error("E0401", f"`{name}`'s path is a string, not {path.show()}", args[0].span,  # type: ignore
                 f"this is {path.show()}")
    m = ck.expr(args[1].value)  # type: ignore[union-attr]
    changes = name == "load"
    ck.check_mut(args[1], changes, "model", f"`{name}`")  # type: ignore[arg-type]
    if not isinstance(m, T.ModelT) and m is not T.UNKNOWN:
        ck.error("E0401", f"`{name}` takes a model, not {m.show()}", args[1].span, f"this is {m.show()}")  # type: ignore
    if args[2] is not None:
        opt = ck.expr(args[2].value)
        ck.check_mut(args[2], changes, "opt", f"`{name}`")
        if not (isinstance(opt, T.OptT) and opt.model is m) and T.UNKNOWN not in (opt, m):
            ck.error("E0401", f"`{name}` takes the model's optimizer, not {opt.show()}", args[2].span,
                     f"this is {opt.show()}")
    ck.record_call(node, "builtin", name, [a.value for a in args if a is not None])
    return T.NONE


# ---- arithmetic of plain numbers, typed as Python computes it --------------------------------

def number_arith(ck: "BodyChecker", node: A.Binary, left: T.ScalarT, right: T.ScalarT) -> T.Ty:
    """`left op right` of two plain numbers (int, float, bool): float with a float or for `/`; a
    whole number to a whole power is an int when the exponent is at least 0 and a float below
    (`2 ** -1` is 0.5), so the exponent must be known: a literal or a dim's size."""
    if "float" in (left.kind, right.kind) or node.op == "/":
        return T.FLOAT
    if node.op != "**":
        return T.INT
    exponent = _whole_exponent(ck, node, "of two whole numbers is an int for an exponent of 0 or more and a "
                               "float below")
    if exponent is None:
        return T.UNKNOWN
    return T.INT if exponent >= 0 else T.FLOAT


def whole_tensor_power(ck: "BodyChecker", node: A.Binary, dtype: str, number: T.ScalarT) -> bool:
    """`x ** k` of an integer or bool tensor and a whole number k: torch refuses a k below 0, so k
    must be known to be at least 0. False (with the error given) where it isn't."""
    if node.op != "**" or dtype in T.FLOAT_DTYPES or number.kind not in ("int", "bool"):
        return True
    exponent = _whole_exponent(ck, node, f"of an {dtype} tensor is refused by torch for an exponent below 0")
    if exponent is not None and exponent < 0:
        ck.error("E0308", f"`**` of an {dtype} tensor and a negative whole number: torch refuses integers "
                 "to negative powers", node.span, "a negative power", "convert first, as `to(x, f32) ** -1`")
        return False
    return exponent is not None


def _whole_exponent(ck: "BodyChecker", node: A.Binary, why: str) -> int | float | None:
    """The value of `**`'s whole-number exponent, or 1 for a dim's size (positive); None, with an
    error, where its sign isn't known."""
    exponent = literal_number(node.right)
    if isinstance(node.right, A.BoolLit):
        exponent = int(node.right.value)
    if exponent is None and "size" in ck.checked.recipes.get(id(node.right), {}):
        exponent = 1
    if exponent is None:
        ck.error("E0308", f"`**` {why}, and this exponent's sign isn't known", node.span, "sign unknown",
                 "write the base as a float, as `2.0 ** k` or `to(x, f32) ** k`")
    return exponent


def number_negation(t: T.Ty) -> T.Ty:
    """`-x` of a plain number: Python negates a bool as the int it is (`-true` is -1)."""
    return T.INT if t == T.BOOL else t


# ---- modes -----------------------------------------------------------------------------------

@rule("Train")
def train_mode(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["seed"], "`Train`")
    if args is None or not int_arg(ck, args[0], "`Train`'s seed"):
        return T.UNKNOWN
    ck.record_call(node, "builtin", "Train", [args[0].value])  # type: ignore[union-attr]
    return T.MODE


@rule("Eval")
def eval_mode(ck: "BodyChecker", node: A.Call) -> T.Ty:
    if node.args:
        return ck.error("E0206", "`Eval()` takes no arguments", node.span)
    ck.record_call(node, "builtin", "Eval", [])
    return T.MODE


@rule("valid")
def valid(ck: "BodyChecker", node: A.Call) -> T.Ty:
    """`valid(batch, n)`: true at the positions along `n` that hold an item's own values, false at
    the padding the loader added to reach the batch's longest item."""
    args = ck.arrange(node, ["batch", "dim"], "`valid`")
    if args is None:
        return _unused_args(ck, node)
    batch = ck.expr(args[0].value)  # type: ignore[union-attr]
    if not isinstance(batch, T.BatchT):
        return batch if batch is T.UNKNOWN else ck.error(
            "E0401", f"`valid` takes a batch, not {batch.show()}", args[0].span, f"this is {batch.show()}")  # type: ignore
    name = args[1].value  # type: ignore[union-attr]
    dim = ck.dims.get(name.id) if isinstance(name, A.Name) else None
    label = next((n for n, d in batch.padded if dim is not None and d == dim), None)
    if label is None:
        padded = ", ".join(n for n, _ in batch.padded) or "none"
        return ck.error("E0303", f"`valid` takes a dim the batch pads; {batch.data.name}'s are: {padded}",
                        args[1].span, "not a padded dim",  # type: ignore[union-attr]
                        "a data type's generic dims, as `n` in `tokens: [n]`, are padded per batch")
    ck.use("tensors", node.span)
    ck.record_call(node, "builtin", "valid", [args[0].value], label=label)  # type: ignore[union-attr]
    return T.TensorT(batch.axes + (T.axis(dim),), "bool")  # type: ignore[arg-type]
