"""Rules of the standard library's tensor operations beyond arithmetic and reductions: elementwise
pairs, masks, lookups, operations along an axis, gradient norms and dropout."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..syntax import ast as A
from . import dims as D
from . import types as T
from .builtins import (_unused_args, broadcast, int_arg, literal_number, over_axis, placed_within, rule,
                       tensor_arg)
from .ops.elementwise import refused_dtype

if TYPE_CHECKING:
    from .bodies import BodyChecker

MODE = T.NamedT("Mode")
# The largest magnitude each dtype holds: torch refuses to fill a tensor with a number beyond it.
LARGEST = {"f16": 65504.0, "bf16": 3.3895313892515355e38, "f32": 3.4028234663852886e38, "f64": float("inf"),
           "i32": 2.0 ** 31 - 1, "i64": 2.0 ** 63 - 1, "bool": float("inf")}


def _number(ck: "BodyChecker", arg: A.Arg | None, what: str) -> bool:
    if arg is None:
        return True
    t = ck.expr(arg.value)
    if t in (T.INT, T.FLOAT) or t is T.UNKNOWN:
        return True
    ck.error("E0401", f"{what} is a number, not {t.show()}", arg.span, f"this is {t.show()}")
    return False


@rule("maximum", "minimum")
def pairwise(ck: "BodyChecker", node: A.Call) -> T.Ty:
    name = node.func.id  # type: ignore[union-attr]
    args = ck.arrange(node, ["a", "b"], f"`{name}`")
    if args is None:
        return _unused_args(ck, node)
    a, b = (tensor_arg(ck, x, f"`{name}`") for x in args)
    if a is None or b is None:
        return T.UNKNOWN
    if a.dtype != b.dtype:
        return ck.error("E0308", f"`{name}` of {a.dtype} and {b.dtype}", node.span, "different dtypes")
    axes = broadcast(ck, node, a, b)
    if axes is None:
        return T.UNKNOWN
    ck.record_call(node, "builtin", name, [x.value for x in args])  # type: ignore[union-attr]
    return T.TensorT(axes, a.dtype)


@rule("clamp")
def clamp(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["x", "min", "max"], "`clamp`", required=1)
    if args is None:
        return _unused_args(ck, node)
    t = tensor_arg(ck, args[0], "`clamp`")
    ok = _number(ck, args[1], "`clamp`'s min") and _number(ck, args[2], "`clamp`'s max")
    if t is None or not ok:
        return T.UNKNOWN
    if args[1] is None and args[2] is None:
        return ck.error("E0206", "`clamp` needs `min=`, `max=` or both", node.span, "no bounds")
    ck.record_call(node, "builtin", "clamp", [args[0].value], min=args[1], max=args[2])  # type: ignore[union-attr]
    bounds = [ck.checked.types[id(a.value)] for a in args[1:] if a is not None]  # type: ignore[union-attr]
    return T.TensorT(t.axes, _with_numbers(t.dtype, bounds))


def _with_numbers(dtype: str, numbers: list[T.Ty]) -> str:
    """The dtype torch gives a tensor of `dtype` with these numbers (clamp's bounds, where's other
    branch): an integer or bool tensor with a float is f32, a bool tensor with an int is i64."""
    from .bodies import promoted  # bodies imports the rules
    for t in numbers:
        if isinstance(t, T.ScalarT):
            dtype = promoted(dtype, t.kind, "+")
    return dtype


@rule("where")
def where(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["cond", "a", "b"], "`where`")
    if args is None:
        return _unused_args(ck, node)
    cond = tensor_arg(ck, args[0], "`where`'s condition")
    a, b = (ck.operand(x.value) for x in args[1:])  # type: ignore[union-attr]
    if cond is None or T.UNKNOWN in (a, b):
        return T.UNKNOWN
    if cond.dtype != "bool":
        return ck.error("E0308", f"`where`'s condition must be bool, not {cond.dtype}", args[0].span,  # type: ignore
                        f"this is {cond.show()}", "compare it first, as `x > 0`")
    tensors = [t for t in (a, b) if isinstance(t, T.TensorT)]
    if not tensors:  # two numbers: a tensor of the condition's shape
        dtype = "f32" if T.FLOAT in (a, b) else "bool" if a == b == T.BOOL else "i64"
        ck.record_call(node, "builtin", "where", [x.value for x in args], cond_index=())  # type: ignore
        return T.TensorT(cond.axes, dtype)
    if len(tensors) == 1 and T.FLOAT in (a, b) and not tensors[0].is_float:
        return ck.error("E0308", f"`where` chooses between {tensors[0].dtype} and a float", node.span,
                        "different dtypes", "write the number as an integer, or convert the tensor")
    if len(tensors) == 2 and (a.dtype != b.dtype or not all(  # type: ignore[union-attr]
            x.same(y) for x, y in zip(a.axes, b.axes)) or a.rank != b.rank):  # type: ignore[union-attr]
        return ck.error("E0301", f"`where` chooses between {a.show()} and {b.show()}, which must be the same",
                        node.span, "different types")
    result = tensors[0]
    index = placed_within(ck, args[0], result, cond, "the condition")  # type: ignore[arg-type]
    if index is None:
        return T.UNKNOWN
    ck.record_call(node, "builtin", "where", [x.value for x in args], cond_index=index)  # type: ignore[union-attr]
    return T.TensorT(result.axes, _with_numbers(result.dtype, [a, b]))


@rule("masked_fill")
def masked_fill(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["x", "mask", "value"], "`masked_fill`")
    if args is None:
        return _unused_args(ck, node)
    x = tensor_arg(ck, args[0], "`masked_fill`")
    mask = tensor_arg(ck, args[1], "`masked_fill`'s mask")
    if not _number(ck, args[2], "the fill value") or x is None or mask is None:
        return T.UNKNOWN
    if mask.dtype != "bool":
        return ck.error("E0308", f"a mask is bool, not {mask.dtype}", args[1].span, f"this is {mask.show()}")  # type: ignore
    fill = literal_number(args[2].value)  # type: ignore[union-attr]
    if fill is not None and not -LARGEST[x.dtype] <= fill <= LARGEST[x.dtype]:
        return ck.error("E0401", f"the fill value {fill:g} doesn't fit {x.dtype}, whose values lie within "
                        f"±{LARGEST[x.dtype]:g}", args[2].span, f"too large for {x.dtype}",  # type: ignore[union-attr]
                        f"fill with a value that fits, as -1e4 for f16, or convert first, as `to(x, f32)`")
    index = placed_within(ck, args[1], x, mask, "the mask")  # type: ignore[arg-type]
    if index is None:
        return T.UNKNOWN
    ck.record_call(node, "builtin", "masked_fill", [a.value for a in args], mask_index=index)  # type: ignore
    return T.TensorT(x.axes, x.dtype)


@rule("to")
def to(ck: "BodyChecker", node: A.Call) -> T.Ty:
    """`to(x, f32)`: the same tensor with another dtype, value by value (torch's `.to`); an `Index`
    bound doesn't survive, since nothing is known of the values' range after a conversion.
    `to(0.0, f32)`: a number as a `[]` tensor, as a loop's running total starts."""
    args = ck.arrange(node, ["x", "dtype"], "`to`")
    if args is None:
        return _unused_args(ck, node)
    t = ck.operand(args[0].value)  # type: ignore[union-attr]  (a tensor or a number; else reported)
    number = isinstance(t, T.ScalarT)
    dtype = args[1].value  # type: ignore[union-attr]
    if not (isinstance(dtype, A.Name) and dtype.id in T.DTYPES):
        return ck.error("E0401", "`to` takes a dtype second, as `to(x, f32)`", args[1].span,  # type: ignore
                        "not a dtype", f"the dtypes: {', '.join(T.DTYPES)}")
    if number:
        ck.use("tensors", args[0].span)  # type: ignore[union-attr]
        ck.record_call(node, "builtin", "to", [args[0].value], dtype=dtype.id, number=True)  # type: ignore
        return T.TensorT((), dtype.id)
    if not isinstance(t, T.TensorT):
        return T.UNKNOWN
    ck.record_call(node, "builtin", "to", [args[0].value], dtype=dtype.id)  # type: ignore[union-attr]
    return T.TensorT(t.axes, dtype.id)


def dim_source(ck: "BodyChecker", node: A.Node) -> tuple[D.Dim, object] | None:
    """A dim named by `node`, and how to get its size when the program runs: an int, or
    (parameter, axis) for a generic dim that a parameter's shape gives."""
    if not isinstance(node, A.Name):
        ck.error("E0303", "expected a dim, as `causal(i, j)`", node.span, "not a dim name")
        return None
    if node.id in ck.ctx.dim_values and node.id not in ck.dims:  # declared: its size, or None until loaded
        return D.declared(node.id), ck.ctx.dim_values[node.id]
    dim = ck.dims.get(node.id)
    if dim is None:
        from .checker import similar  # the checker imports this module
        ck.error("E0303", f"`{node.id}` isn't a dim here", node.span, "unknown dim",
                 similar(node.id, list(ck.dims) + list(ck.ctx.dim_values)))
        return None
    for p in ck.fn.params:
        t = p.ty
        axes = t.axes if isinstance(t, (T.TensorT, T.BatchT)) else ()
        for k, a in enumerate(axes):
            if a.size == dim:
                return dim, (p.name, "size" if isinstance(t, T.BatchT) else k)
    ck.error("E0303", f"the size of `{node.id}` isn't known here", node.span, "no parameter has this axis",
             f"take a parameter with an axis `{node.id}`")
    return None


@rule("causal")
def causal(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["i", "j"], "`causal`")
    if args is None:
        return T.UNKNOWN
    i, j = dim_source(ck, args[0].value), dim_source(ck, args[1].value)  # type: ignore[union-attr]
    if i is None or j is None:
        return T.UNKNOWN
    ck.use("tensors", node.span)
    ck.record_call(node, "builtin", "causal", [], sizes=(i[1], j[1]))
    return T.TensorT((T.axis(i[0]), T.axis(j[0])), "bool")


def count_source(ck: "BodyChecker", node: A.Node, what: str) -> tuple[D.Dim, object] | None:
    """A count given as a dim (`n`, its size read as `dim_source` reads it) or as a positive literal."""
    value = literal_number(node)
    if value is None:
        return dim_source(ck, node)
    if not isinstance(node, A.IntLit) or value <= 0:
        ck.error("E0310", f"{what} is a dim or a positive whole number, not {value}", node.span, "not a size")
        return None
    return D.literal(node.value), node.value


@rule("positions")
def positions(ck: "BodyChecker", node: A.Call) -> T.Ty:
    """`positions(n)`: the positions 0, 1, ..., n-1 along a dim, `[n] Index[n]` (torch.arange)."""
    args = ck.arrange(node, ["n"], "`positions`")
    if args is None:
        return T.UNKNOWN
    count = count_source(ck, args[0].value, "`positions`'s count")  # type: ignore[union-attr]
    if count is None:
        return T.UNKNOWN
    ck.use("tensors", node.span)
    ck.record_call(node, "builtin", "positions", [], sizes=(count[1],))
    return T.TensorT((T.axis(count[0]),), "i64", count[0])


@rule("first")
def first(ck: "BodyChecker", node: A.Call) -> T.Ty:
    """`first(x, n, over=T)`: x's first n entries along its axis T (its leading axis without `over=`),
    as a `[T D]` table of position embeddings is read for a sequence of n <= T tokens. n <= T is
    checked here when both sizes are known, and by the lowered call when it runs otherwise."""
    args = ck.arrange(node, ["x", "n", "over"], "`first`", required=2)
    if args is None:
        return T.UNKNOWN
    t = tensor_arg(ck, args[0], "`first`")
    count = count_source(ck, args[1].value, "`first`'s count")  # type: ignore[union-attr]
    if t is None or count is None:
        return T.UNKNOWN
    if t.rank == 0:
        return ck.error("E0302", f"`first` takes entries along an axis, and {t.show()} has none",
                        args[0].span, f"this is {t.show()}")  # type: ignore[union-attr]
    axis = over_axis(ck, args[2], t, "`first`") if args[2] is not None else 0
    if axis is None:
        return T.UNKNOWN
    taken, (dim, source) = t.axes[axis], count
    have, want = D.value(taken.size, ck.ctx.dim_values), D.value(dim, ck.ctx.dim_values)
    if have is not None and want is not None and want > have:
        counted = str(want) if dim.is_Integer else f"{D.show(dim)} = {want}"
        return ck.error("E0310", f"`first` takes {counted} entries along {taken.show()}, which has {have}",
                        args[1].span, "too many",  # type: ignore[union-attr]
                        f"take at most {have}, or give {taken.show()} a size of at least {want}")
    ck.record_call(node, "builtin", "first", [args[0].value], axis=axis, sizes=(source,),  # type: ignore[union-attr]
                   names=(D.show(dim), taken.show()))
    return T.TensorT(t.axes[:axis] + (T.axis(dim),) + t.axes[axis + 1:], t.dtype, t.index)


@rule("one_hot")
def one_hot(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["labels"], "`one_hot`")
    if args is None:
        return _unused_args(ck, node)
    t = tensor_arg(ck, args[0], "`one_hot`")
    if t is None:
        return T.UNKNOWN
    count = D.value(t.index, ck.ctx.dim_values) if t.index is not None else None
    if count is None:
        return ck.error("E0309", f"`one_hot` takes labels typed `Index[C]` with a declared C, not {t.show()}",
                        args[0].span, "no known bound")  # type: ignore[union-attr]
    ck.record_call(node, "builtin", "one_hot", [args[0].value], classes=count)  # type: ignore[union-attr]
    return T.TensorT(t.axes + (T.axis(t.index),), "f32")  # type: ignore[arg-type]


@rule("embedding")
def embedding(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["table", "ids"], "`embedding`")
    if args is None:
        return _unused_args(ck, node)
    table = tensor_arg(ck, args[0], "`embedding`", floats=True)
    ids = tensor_arg(ck, args[1], "`embedding`'s ids")
    if table is None or ids is None:
        return T.UNKNOWN
    if table.rank != 2:
        return ck.error("E0302", f"an embedding table has two axes, [V D], not {table.show()}", args[0].span)  # type: ignore
    if ids.index is None or not D.equal(ids.index, table.axes[0].size):
        return ck.error("E0309", f"the ids must be `Index[{table.axes[0].show()}]`, the table's rows, but are "
                        f"{ids.show()}", args[1].span, "not known to be in range")  # type: ignore[union-attr]
    ck.record_call(node, "builtin", "embedding", [a.value for a in args])  # type: ignore[union-attr]
    return T.TensorT(ids.axes + table.axes[1:], table.dtype)


@rule("topk")
def topk(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["x", "k", "over"], "`topk`")
    if args is None:
        return _unused_args(ck, node)
    t = tensor_arg(ck, args[0], "`topk`")
    k_node = args[1].value  # type: ignore[union-attr]
    if not (isinstance(k_node, A.IntLit) and k_node.value > 0):
        int_arg(ck, args[1], "`topk`'s k")
        return ck.error("E0310", "`topk`'s k is a positive literal, as `topk(x, 5, over=C)`", args[1].span)  # type: ignore
    if t is None or refused_dtype(ck, "topk", args[0], t):  # type: ignore[arg-type]
        return T.UNKNOWN
    axis = over_axis(ck, args[2], t, "`topk`")  # type: ignore[arg-type]
    if axis is None:
        return T.UNKNOWN
    picked = t.axes[axis]
    size = D.value(picked.size, ck.ctx.dim_values)
    if size is not None and k_node.value > size:
        return ck.error("E0310", f"`topk` of {k_node.value} from {picked.show()} = {size}", args[1].span, "too many")  # type: ignore
    ck.record_call(node, "builtin", "topk", [args[0].value], axis=axis, k=k_node.value)  # type: ignore[union-attr]
    axes = t.axes[:axis] + (T.axis(D.literal(k_node.value)),) + t.axes[axis + 1:]
    return T.TupleT((T.TensorT(axes, t.dtype), T.TensorT(axes, "i64", picked.size)))


@rule("gather", "scatter")
def gather(ck: "BodyChecker", node: A.Call) -> T.Ty:
    name = node.func.id  # type: ignore[union-attr]
    names = ["x", "index", "over"] if name == "gather" else ["x", "index", "src", "over"]
    args = ck.arrange(node, names, f"`{name}`")
    if args is None:
        return _unused_args(ck, node)
    x = tensor_arg(ck, args[0], f"`{name}`")
    idx = tensor_arg(ck, args[1], f"`{name}`'s index")
    src = tensor_arg(ck, args[2], f"`{name}`'s src") if name == "scatter" else None
    if x is None or idx is None or (name == "scatter" and src is None):
        return T.UNKNOWN
    axis = over_axis(ck, args[-1], x, f"`{name}`")  # type: ignore[arg-type]
    if axis is None:
        return T.UNKNOWN
    picked = x.axes[axis]
    if idx.index is None or not D.equal(idx.index, picked.size):
        return ck.error("E0309", f"`{name}`'s index must be `Index[{picked.show()}]`, but is {idx.show()}",
                        args[1].span, "not known to be in range")  # type: ignore[union-attr]
    others_x = x.axes[:axis] + x.axes[axis + 1:]
    others_i = idx.axes[:axis] + idx.axes[axis + 1:] if idx.rank == x.rank else None
    if others_i is None or not all(a.same(b) for a, b in zip(others_x, others_i)):
        return ck.error("E0301", f"`{name}`'s index must be {x.show()} but for its {picked.show()} axis; it is "
                        f"{idx.show()}", args[1].span, f"this is {idx.show()}")  # type: ignore[union-attr]
    if src is not None and (src.dtype != x.dtype or src.rank != idx.rank
                            or not all(a.same(b) for a, b in zip(src.axes, idx.axes))):
        return ck.error("E0301", f"`scatter`'s src must be {T.TensorT(idx.axes, x.dtype).show()}, like the index",
                        args[2].span, f"this is {src.show()}")  # type: ignore[union-attr]
    ck.record_call(node, "builtin", name, [a.value for a in args[:-1]], axis=axis)  # type: ignore[union-attr]
    return T.TensorT(idx.axes, x.dtype) if name == "gather" else T.TensorT(x.axes, x.dtype)


@rule("clip_norm")
def clip_norm(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["grads", "max"], "`clip_norm`")
    if args is None:
        return _unused_args(ck, node)
    g = ck.expr(args[0].value)  # type: ignore[union-attr]
    if not _number(ck, args[1], "`clip_norm`'s max"):
        return T.UNKNOWN
    if not isinstance(g, T.GradT):
        return g if g is T.UNKNOWN else ck.error("E0401", f"`clip_norm` takes gradients, not {g.show()}",
                                                 args[0].span, f"this is {g.show()}")  # type: ignore
    ck.record_call(node, "builtin", "clip_norm", [a.value for a in args])  # type: ignore[union-attr]
    return g


@rule("dropout")
def dropout(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["x", "p", "mode"], "`dropout`")
    if args is None:
        return _unused_args(ck, node)
    t = tensor_arg(ck, args[0], "`dropout`", floats=True)
    p_node = args[1].value  # type: ignore[union-attr]
    if not _number(ck, args[1], "`dropout`'s p"):
        return T.UNKNOWN
    p_value = literal_number(p_node)
    if p_value is not None and not 0 <= p_value < 1:
        return ck.error("E0310", f"`dropout`'s p is a probability below 1, not {p_value}", args[1].span)  # type: ignore
    mode = ck.expr(args[2].value)  # type: ignore[union-attr]
    if mode != MODE and mode is not T.UNKNOWN:
        return ck.error("E0401", f"`dropout`'s mode is Train(seed=...) or Eval, not {mode.show()}",
                        args[2].span, f"this is {mode.show()}", "take a `mode: Mode` parameter")  # type: ignore
    if t is None:
        return T.UNKNOWN
    # batch_axis: the operand's axis split across the devices, set by check/split.py (None: unsplit)
    ck.record_call(node, "builtin", "dropout", [a.value for a in args], batch_axis=None)  # type: ignore[union-attr]
    return T.TensorT(t.axes, t.dtype)


@rule("Train")
def train_mode(ck: "BodyChecker", node: A.Call) -> T.Ty:
    args = ck.arrange(node, ["seed"], "`Train`")
    if args is None or not int_arg(ck, args[0], "`Train`'s seed"):
        return T.UNKNOWN
    ck.record_call(node, "builtin", "Train", [args[0].value])  # type: ignore[union-attr]
    return MODE


@rule("Eval")
def eval_mode(ck: "BodyChecker", node: A.Call) -> T.Ty:
    if node.args:
        return ck.error("E0206", "`Eval()` takes no arguments", node.span)
    ck.record_call(node, "builtin", "Eval", [])
    return MODE


@rule("norm")
def norm(ck: "BodyChecker", node: A.Call) -> T.Ty:
    """The 2-norm of a tensor (over one axis, or all), or of a model's gradients taken together."""
    args = ck.arrange(node, ["x", "over"], "`norm`", required=1)
    if args is None:
        return _unused_args(ck, node)
    t = ck.expr(args[0].value)  # type: ignore[union-attr]
    if isinstance(t, T.GradT):
        if args[1] is not None:
            return ck.error("E0206", "the norm of gradients is over all of them; it takes no `over=`",
                            args[1].span, "unexpected")
        ck.record_call(node, "builtin", "grad_norm", [args[0].value])  # type: ignore[union-attr]
        dtypes = _param_dtypes(t.model)
        return T.scalar_tensor(dtypes.pop() if len(dtypes) == 1 else "f32")
    if not isinstance(t, T.TensorT) or not t.is_float:
        return t if t is T.UNKNOWN else ck.error("E0401", f"`norm` takes float tensors or gradients, not "
                                                 f"{t.show()}", args[0].span, f"this is {t.show()}")  # type: ignore
    ck.use("tensors", node.span)
    axis = over_axis(ck, args[1], t, "`norm`") if args[1] is not None else None
    if args[1] is not None and axis is None:
        return T.UNKNOWN
    ck.record_call(node, "builtin", "norm", [args[0].value], axis=axis)  # type: ignore[union-attr]
    return T.TensorT(t.axes[:axis] + t.axes[axis + 1:] if axis is not None else (), t.dtype)


def _param_dtypes(model: T.ModelT) -> set[str]:
    out: set[str] = set()
    for m in model.members.values():
        if m.kind == "param" and m.tensor is not None:
            out.add(m.tensor.dtype)
        elif m.model is not None:
            out |= _param_dtypes(m.model)
    return out


@rule("batch_norm")
def batch_norm(ck: "BodyChecker", node: A.Call) -> T.Ty:
    """`batch_norm(x, stats, mode, over=C)`: normalize each C-channel over every other axis; `stats`
    is a model with buffers `mean: [C]` and `var: [C]`, the running statistics that Train updates
    (as PyTorch's buffers are, without `mut`) and Eval uses."""
    args = ck.arrange(node, ["x", "stats", "mode", "over"], "`batch_norm`")
    if args is None:
        return _unused_args(ck, node)
    t = tensor_arg(ck, args[0], "`batch_norm`", floats=True)
    stats = ck.expr(args[1].value)  # type: ignore[union-attr]
    mode = ck.expr(args[2].value)  # type: ignore[union-attr]
    if mode != MODE and mode is not T.UNKNOWN:
        return ck.error("E0401", f"`batch_norm`'s mode is Train(seed=...) or Eval, not {mode.show()}",
                        args[2].span, f"this is {mode.show()}")  # type: ignore[union-attr]
    if t is None or stats is T.UNKNOWN:
        return T.UNKNOWN
    axis = over_axis(ck, args[3], t, "`batch_norm`")  # type: ignore[arg-type]
    if axis is None:
        return T.UNKNOWN
    if t.rank < 2:
        return ck.error("E0302", f"`batch_norm` needs an axis to take statistics over besides "
                        f"{t.axes[axis].show()}", args[0].span, f"this is {t.show()}")  # type: ignore[union-attr]
    channel = T.TensorT((t.axes[axis],), t.dtype)
    ok = isinstance(stats, T.ModelT) and all(
        (mem := stats.members.get(name)) is not None and mem.kind == "buffer" and mem.tensor is not None
        and mem.tensor.rank == 1 and mem.tensor.axes[0].same(channel.axes[0]) and mem.tensor.dtype == t.dtype
        for name in ("mean", "var"))
    if not ok:
        return ck.error("E0401", f"`batch_norm`'s statistics are a model with buffers `mean: {channel.show()}` and "
                        f"`var: {channel.show()}`, not {stats.show()}", args[1].span,  # type: ignore[union-attr]
                        f"this is {stats.show()}",
                        f"declare `model Stats:` with `buffer mean: {channel.show()} = zeros()` and "
                        f"`buffer var: {channel.show()} = ones()`")
    ck.record_call(node, "builtin", "batch_norm", [a.value for a in args[:3]], axis=axis)  # type: ignore[union-attr]
    return T.TensorT(t.axes, t.dtype)


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
