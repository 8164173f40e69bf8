"""The built-ins of the controller's statements: data (`shuffle`, `batches`), output (`print`,
`logs`, `write`) and checkpoints (`save`, `load`); and the modes, `Train(seed=...)` and `Eval()`.

The rules of shuffle, print, write, save and load record what makes their function run in the
controller (`uses`, which plan/placement.py reads: a loop over a dataset, a print, a sink's
write, a checkpoint). None of them works across the batch axis: the controller's built-ins work on
whole datasets and values where nothing is split, and a mode holds no value of the batch.
"""

from __future__ import annotations

import keyword

from ..shapes import value_types as T
from ..shapes.options import BatchesOptions, CallOptions, LogsOptions
from ..syntax import tree as A
from .args import called_name, int_arg, literal_number
from .checking import RuleChecker, Use
from .table import PER_EXAMPLE, Args, LowerCall, Op, Typed, register, runtime_function, typed

# Nothing of what they work on is split across the devices (see above).
NOT_SPLIT = PER_EXAMPLE

# ---- data ----------------------------------------------------------------------------------------


def shuffle_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.Ty:
    data, seed = args
    assert data is not None and seed is not None
    t = ck.expr(data.expr)
    int_arg(ck, seed, "`shuffle`'s seed")
    ck.use(Use.LOOP, node.span)
    if not isinstance(t, T.DatasetT):
        return t if t is T.UNKNOWN else ck.error("E0401", f"`shuffle` takes a dataset, not {t.show()}",
                                                 data.span, f"this is {t.show()}")
    return typed(t, (data.expr, seed.expr))


def batches_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[BatchesOptions] | T.Ty:
    """The dataset cut into batches; the options name its data type (the lowering hands the run time
    its spec) and a size written as a number (the DeviceTable shows the batch size)."""
    data, size_arg = args
    assert data is not None and size_arg is not None
    t = ck.expr(data.expr)
    int_arg(ck, size_arg, "a batch's size")
    size = literal_number(size_arg.value)
    if size is not None and size <= 0:
        return ck.error("E0310", f"a batch holds at least one example, not {size}", size_arg.span,
                        "not a size")
    if not isinstance(t, T.DatasetT):
        return t if t is T.UNKNOWN else ck.error("E0401", f"`batches` takes a dataset, not {t.show()}",
                                                 data.span, f"this is {t.show()}")
    written = size_arg.value.value if isinstance(size_arg.value, A.IntLit) else None
    return Typed(T.BatchesT(t.data, size), (data.expr, size_arg.expr),
                 BatchesOptions(t.data.name, written))


def batches_lower(call: LowerCall[BatchesOptions]) -> str:
    return f"_rt.batches({call.args[0]}, {call.args[1]}, {call.spec(call.options.data)}, DEVICE)"


# ---- output --------------------------------------------------------------------------------------

def print_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.Ty:
    """Any number of values, placed by the rule itself."""
    for a in node.args:
        if a.keyword or a.mut or isinstance(a.value, A.Pattern):
            ck.error("E0206", "`print` takes values only", a.span, "unexpected here")
            continue
        ck.expr(a.value)
    ck.use(Use.PRINT, node.span)
    return typed(T.NONE, tuple(a.value for a in node.args if not isinstance(a.value, A.Pattern)))


def logs_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[LogsOptions] | T.Ty:
    """Named values, placed by the rule itself; the options carry their names."""
    seen: set[str] = set()
    for a in node.args:
        if not a.keyword:
            ck.error("E0206", "`logs` takes named values, as `logs(loss=l)`", a.span, "no name")
            continue
        if a.keyword in seen:
            ck.error("E0206", f"`{a.keyword}` is logged twice", a.span, "given again")
            continue
        seen.add(a.keyword)
        t = ck.expr(a.expr)
        if not (isinstance(t, (T.TensorT, T.ScalarT)) or t is T.UNKNOWN):
            ck.error("E0401", f"a log holds numbers and tensors, not {t.show()}", a.span, f"this is {t.show()}")
    named = [a for a in node.args if not isinstance(a.value, A.Pattern)]
    names = tuple(a.keyword or "" for a in named)  # "": a value without a name, refused above
    return Typed(T.LOGS, tuple(a.expr for a in named), LogsOptions(names))


def logs_lower(call: LowerCall[LogsOptions]) -> str:
    names = call.options.names
    if any(keyword.iskeyword(k) for k in names):  # e.g. logs(class=x): not a Python keyword argument
        pairs = ", ".join(f"{call.literal(k)}: {v}" for k, v in zip(names, call.args))
        return f"_rt.logs(**{{{pairs}}})"
    return f"_rt.logs({', '.join(f'{k}={v}' for k, v in zip(names, call.args))})"


def write_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.Ty:
    sink_arg, record_arg = args
    assert sink_arg is not None and record_arg is not None
    sink, record = ck.expr(sink_arg.expr), ck.expr(record_arg.expr)
    ck.use(Use.WRITE, node.span)
    for arg, t, want in ((sink_arg, sink, T.SINK), (record_arg, record, T.LOGS)):
        if t != want and t is not T.UNKNOWN:
            ck.error("E0401", f"`write` takes a {want.show()} here, not {t.show()}", arg.span,
                     f"this is {t.show()}", "write(log, logs(loss=l))")
    return typed(T.NONE, (sink_arg.expr, record_arg.expr))


# ---- checkpoints ---------------------------------------------------------------------------------

def checkpoint_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.Ty:
    """`save(path, m)` / `save(path, m, opt)`, and `load` of the same with `mut`, which it changes."""
    name = called_name(node)
    path_arg, model_arg, opt_arg = args
    assert path_arg is not None and model_arg is not None
    ck.use(Use(name), node.span)  # save or load
    path = ck.expr(path_arg.expr)
    if path != T.STR and path is not T.UNKNOWN:
        ck.error("E0401", f"`{name}`'s path is a string, not {path.show()}", path_arg.span,
                 f"this is {path.show()}")
    m = ck.expr(model_arg.expr)
    changes = name == "load"
    ck.check_mut(model_arg, changes, "model", f"`{name}`")
    if not isinstance(m, T.ModelT) and m is not T.UNKNOWN:
        ck.error("E0401", f"`{name}` takes a model, not {m.show()}", model_arg.span, f"this is {m.show()}")
    if opt_arg is not None:
        opt = ck.expr(opt_arg.expr)
        ck.check_mut(opt_arg, changes, "opt", f"`{name}`")
        if not (isinstance(opt, T.OptT) and opt.model is m) and T.UNKNOWN not in (opt, m):
            ck.error("E0401", f"`{name}` takes the model's optimizer, not {opt.show()}", opt_arg.span,
                     f"this is {opt.show()}")
    return typed(T.NONE, tuple(a.expr for a in args if a is not None))


# ---- modes ---------------------------------------------------------------------------------------

def train_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.Ty:
    (seed,) = args
    assert seed is not None
    if not int_arg(ck, seed, "`Train`'s seed"):
        return T.UNKNOWN
    return typed(T.MODE, (seed.expr,))


def eval_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.Ty:
    if node.args:
        return ck.error("E0206", "`Eval()` takes no arguments", node.span)
    return typed(T.MODE, ())


register(
    Op("shuffle", ("data", "seed"), 2, shuffle_rule, runtime_function("shuffle"), NOT_SPLIT),
    Op("batches", ("data", "size"), 2, batches_rule, batches_lower, NOT_SPLIT),
    Op("print", ("values",), 0, print_rule, runtime_function("show"), NOT_SPLIT, own_args=True, checks_mut=True),
    Op("logs", ("values",), 0, logs_rule, logs_lower, NOT_SPLIT, own_args=True, makes_record=True),
    Op("write", ("sink", "record"), 2, write_rule, runtime_function("write"), NOT_SPLIT, writes_record=True),
    Op("save", ("path", "model", "opt"), 2, checkpoint_rule, runtime_function("save"), NOT_SPLIT,
       checks_mut=True),
    Op("load", ("path", "model", "opt"), 2, checkpoint_rule, runtime_function("load"), NOT_SPLIT,
       checks_mut=True),
    # A mode's argument isn't a value to check again after an error in its place.
    Op("Train", ("seed",), 1, train_rule, lambda call: f"_rt.Train({call.args[0]})", NOT_SPLIT,
       check_rest=False),
    Op("Eval", (), 0, eval_rule, lambda call: "_rt.Eval", NOT_SPLIT, own_args=True),
)
