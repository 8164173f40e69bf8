"""The checker's driver: collect the items, resolve every declared type, check each function's body.

It gathers every error it can find (an expression with an error has the type UNKNOWN, which
silences the errors that would follow from it) and returns a `Checked` or raises CompileError.
"""

from __future__ import annotations

import dataclasses
import re
from types import MappingProxyType

from ..devices import MAX_DEVICES, DeviceSet
from ..dtypes import FLOAT_DTYPES
from ..errors import CompileError, Diagnostic, Span
from ..names import DATA_RESERVED, STD_EXTERNS, is_reserved, similar
from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.kinds import FnKind
from ..syntax import tree as A
from ..syntax.lexer import MAX_INT_DIGITS
from .bodies import check_bodies
from .calls import BUILTIN_NAMES
from .constants import derive_dims
from .context import Context
from .elaborate import elaborate
from .program import Checked, FnInfo, ParamInfo
from .types import declare_members, model_cycles, refuse_reserved, resolve_type

_PYTHON_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def require_sizes(checked: Checked) -> None:
    """E0313 for each declared dim still without a size: a build needs them all, where checking
    doesn't (they may be given when the program is loaded)."""
    unsized = [item for item in checked.program.items
               if isinstance(item, A.Dim) and item.expr is None and checked.dim_values.get(item.name) is None]
    if unsized:
        raise CompileError([Diagnostic(
            "E0313", f"dim `{d.name}` has no size", d.span, "no size",
            (f"give it when loading: ss.load(..., dims={{\"{d.name}\": 65}}), or `--dim {d.name}=65`",))
            for d in unsized], checked.source)


def check_program(program: A.Program, file: str, devices: DeviceSet | None = None,
                  dims: dict[str, int] | None = None, python: bool = True) -> Checked:
    """The program's types: its items, then each function's body (the plans come after:
    shapescript/plan/). `python=False`: refuse every `python fn` and `extern fn` but those of
    ShapeScript's standard library (E0701), for a program from someone one doesn't trust. Checking
    never imports them."""
    ctx = Context(program, file, devices, dims, python)
    with D.derived(ctx.derived):  # while checking, a derived dim equals its definition
        device_set = collect(ctx)
        if not ctx.diagnostics:
            check_bodies(ctx)
            call_cycles(ctx)
        tables = ctx.tables  # frozen from here on: Checked only reads them
        checked = Checked(program, file, program.source, device_set, ctx.dim_values, ctx.data, sized_models(ctx),
                          ctx.fns, MappingProxyType(tables.types), MappingProxyType(tables.calls),
                          MappingProxyType(tables.recipes), ctx.derived, mixed=ctx.mixed, tf32=ctx.tf32)
        if not ctx.diagnostics:
            checked = dataclasses.replace(checked, ir=elaborate(checked))
    ctx.raise_found(program)
    return checked


# ---- items ------------------------------------------------------------------------------------

def collect(ctx: Context) -> DeviceSet:
    items = ctx.program.items
    device_set = DeviceSet()
    device_items = [i for i in items if isinstance(i, A.Devices)]
    for extra in device_items[1:]:
        ctx.error("E0202", "a second `devices` line", extra.span, "the devices are already set",
                  f"keep one; the first is at {device_items[0].span}")
    if device_items:
        device_set = devices_of(ctx, device_items[0])
    if ctx.device_override is not None:  # other devices, the program's layout options kept
        over = ctx.device_override
        device_set = dataclasses.replace(over, shard_params=over.shard_params or device_set.shard_params,
                                         split=over.split or device_set.split, auto=over.auto or device_set.auto,
                                         memory=over.memory or device_set.memory)
    impossible = device_set.impossible()
    if impossible is not None:
        ctx.error("E1806", f"more devices than can run: {impossible.reason}",
                  device_items[0].span if device_items else ctx.program.span, "no machine has these devices",
                  impossible.help)
    precision_of(ctx, [i for i in items if isinstance(i, A.Precision)])
    dims = [i for i in items if isinstance(i, A.Dim) and define(ctx, i.name, i.name_span, "dim")]
    for dim in dims:
        value = ctx.dim_override.get(dim.name, dim.value) if dim.expr is None else None
        if value is not None and value <= 0:
            ctx.error("E0310", f"dim `{dim.name}` must be a positive size, not {value}",
                      dim.span, "not a size", f"pass `--dim {dim.name}=SIZE` with a SIZE of 1 or more"
                      if dim.name in ctx.dim_override else f"give `{dim.name}` a size of 1 or more")
        elif value is not None and value >= 10 ** MAX_INT_DIGITS:  # only a size given when loading can be
            ctx.error("E0310", f"dim `{dim.name}` is given a size of {D.digit_count(value):,} digits", dim.span,
                      "too large a size", f"a size has at most {MAX_INT_DIGITS} digits")
            value = None
        ctx.dim_values[dim.name] = value  # a derived dim's, once its parts' are known
    derive_dims(ctx, dims)
    if impossible is None:  # a split over devices that can't run says nothing more
        layout_options(ctx, device_items[0] if device_items else None, device_set)
    for name in ctx.dim_override:
        if name not in ctx.dim_values:
            ctx.error("E0201", f"no dim `{name}` to set", ctx.program.span, "",
                      similar(name, ctx.dim_values),
                      "dims given when loading must be declared in the program with `dim`")
    for item in items:
        if isinstance(item, A.Data) and define(ctx, item.name, item.name_span, "data type"):
            ctx.data[item.name] = T.DataT(item.name, item)
        elif isinstance(item, A.Model) and define(ctx, item.name, item.name_span, "model"):
            ctx.models[item.name] = T.ModelT(item.name, item, params=model_params(ctx, item),
                                             dtype_params=dtype_params(item))
    for data in ctx.data.values():
        for f in data.node.fields:
            if f.name in data.fields:
                ctx.error("E0202", f"field `{f.name}` is defined twice in `{data.name}`", f.span)
                continue
            if is_reserved(f.name, DATA_RESERVED):
                refuse_reserved(ctx, f, "a batch", DATA_RESERVED)
                continue
            t = resolve_type(ctx, f.type, data.generics, allow_generic=True)
            if isinstance(t, T.TensorT):
                data.fields[f.name] = t
                data.field_nodes[f.name] = f
            elif t is not T.UNKNOWN:
                ctx.error("E0401", f"field `{f.name}` must be a tensor, not {t.show()}", f.type.span,
                          "not a tensor type", "a field's type is a shape such as `[D]` or `[] Index[C]`")
    for model in list(ctx.models.values()):
        declare_members(ctx, model)
    model_cycles(ctx)
    for item in items:
        if isinstance(item, A.Extern) and item.name in BUILTIN_NAMES and item.target == f"shapescript.std.{item.name}":
            ctx.error("E0202", f"`{item.name}` is a built-in now", item.name_span, "declared by the program too",
                      f"delete this declaration: `{item.name}(x, over=...)` calls the built-in, which takes "
                      "the axis as `over=` and its affine params after x (docs/stdlib.md, Norms)")
            continue
        if isinstance(item, (A.Fn, A.Extern)) and define(ctx, item.name, item.name_span, "function"):
            ctx.fns[item.name] = signature(ctx, item)
    return device_set


def devices_of(ctx: Context, node: A.Devices) -> DeviceSet:
    indices = tuple(node.indices) if node.indices is not None else None
    if indices is not None:
        if not indices:
            ctx.error("E0105", "an empty device list", node.span, "no devices",
                      f"write `{node.kind}` for one device, or list them: `{node.kind}[0 1]`")
        elif len(set(indices)) != len(indices):
            ctx.error("E0202", "a device is listed twice", node.span, "repeated device number")
    shard = any(o.kind == "shard" for o in node.options)
    splits = [o for o in node.options if o.kind == "split"]
    autos = [o for o in node.options if o.kind == "layout"]
    budgets = [o for o in node.options if o.kind == "memory"]
    for extra in [*autos[1:], *budgets[1:]]:
        ctx.error("E0202", f"a second `{extra.kind}` option", extra.span, "already given", "keep one")
    given = [o for o in node.options if o.kind in ("shard", "split")]
    if autos and given:
        ctx.error("E1905", f"`layout auto` beside a layout of its own, `{'shard params' if given[0].kind == 'shard' else 'split ' + str(given[0].name)}`",
                  given[0].span, "a layout of its own", f"keep `layout auto` (at {autos[0].span}) to let the compiler "
                  "choose, or remove it to keep this layout")
        autos = []
    return DeviceSet(node.kind, indices, shard, splits[0].name if splits else None, node.hosts, auto=bool(autos),
                     memory=budgets[0].amount if budgets else None)


def layout_options(ctx: Context, node: A.Devices | None, devices: DeviceSet) -> None:
    """`split NAME`: one split (E1903), of a dim (E1904) that the devices divide (E1902)."""
    splits = [o for o in node.options if o.kind == "split"] if node is not None else []
    for extra in splits[1:]:
        ctx.error("E1903", f"a second split, `split {extra.name}`", extra.span, "one split is allowed",
                  f"split one dim: `split {splits[0].name}` is at {splits[0].span}")
    name = devices.split
    if name is None:
        return
    span = splits[0].span if splits else (node.span if node is not None else ctx.program.span)
    if name not in ctx.dim_values:
        ctx.error("E1904", f"`split {name}`: there is no dim `{name}`", span, "not a dim",
                  similar(name, ctx.dim_values) or "split a dim declared with `dim`, as the heads' `dim H = 12`")
        return
    size = ctx.dim_values[name]
    if size is not None and size % devices.count:
        counts = [f"{n:,}" for n in device_counts_dividing(size, 4)]
        on_hosts = f" ({devices.hosts} hosts × {devices.per_host})" if devices.several_hosts else ""
        ctx.error("E1902", f"`split {name}` over {devices.count} devices{on_hosts}, but {name} = {size} isn't a "
                  f"multiple of {devices.count}", span, f"{name} = {size}",
                  f"each device holds an equal part of {name}: use {', '.join(counts[:-1])} or {counts[-1]} "
                  f"devices" if len(counts) > 1 else f"use {counts[0]} devices" if counts
                  else f"{name} = 1 can't be split: remove `split {name}`" if size == 1
                  else f"no number of devices from 2 to {MAX_DEVICES:,} divides {name} = {size}: "
                  f"remove `split {name}`, or give {name} a size with a small factor")


def device_counts_dividing(size: int, wanted: int) -> list[int]:
    """The first `wanted` numbers of devices that divide `size` (2 and up). A program runs on at
    most MAX_DEVICES, so the search stops there, whatever the size: a million steps at the worst."""
    found: list[int] = []
    for n in range(2, min(size, MAX_DEVICES) + 1):
        if size % n == 0:
            found.append(n)
            if len(found) == wanted:
                break
    return found


def precision_of(ctx: Context, lines: list[A.Precision]) -> None:
    """`precision f64`: at most one line, of a float dtype."""
    for extra in lines[1:]:
        ctx.error("E0202", "a second `precision` line", extra.span, "the precision is already set",
                  f"keep one; the first is at {lines[0].span}")
    if not lines:
        return
    if lines[0].dtype == "tf32" and not lines[0].mixed:  # f32 values, a GPU's products in TF32
        ctx.tf32 = True
        return
    if lines[0].dtype not in FLOAT_DTYPES:
        ctx.error("E0204", f"`precision` is a float dtype, not `{lines[0].dtype}`", lines[0].dtype_span,
                  "not a float dtype", similar(lines[0].dtype, FLOAT_DTYPES) or f"one of {', '.join(FLOAT_DTYPES)}")
        return
    if lines[0].mixed:
        mixed_precision(ctx, lines[0])
        return
    ctx.precision = lines[0].dtype


def mixed_precision(ctx: Context, line: A.Precision) -> None:
    """`precision mixed bf16` (or f16): the params, the optimizer's state and every type written without
    a dtype stay f32; the devices compute in bf16 where torch.autocast does (E0208 for another dtype)."""
    if line.dtype in ("bf16", "f16"):  # f16's steps scale the loss (runtime/loss_scale.py)
        ctx.mixed = line.dtype
        return
    ctx.error("E0208", f"`precision mixed {line.dtype}`: mixed precision computes in a float narrower than the "
              f"f32 it keeps, not {line.dtype}", line.dtype_span, "not bf16 or f16",
              "write `precision mixed bf16` (f32's range), or `precision mixed f16` (its loss scaled)")


def model_params(ctx: Context, node: A.Model) -> tuple[str, ...]:
    """A generic model's dims (`model Linear[I O]:`), each named once."""
    names: list[str] = []
    for p in node.params:
        if p.name in names:
            ctx.error("E0202", f"dim `{p.name}` is listed twice in `model {node.name}[...]`", p.span, "a second time")
        else:
            names.append(p.name)
    return tuple(names)


def dtype_params(node: A.Model) -> frozenset[str]:
    """The generic model's params written where a dtype goes (`param w: [I O] T`): given a dtype at
    each use (`Linear[D C f64]`), where the others are given dims."""
    names = {p.name for p in node.params}
    return frozenset(m.type.element.name for m in node.members
                     if isinstance(m.type, A.ShapeType) and m.type.element is not None
                     and not m.type.element.args and m.type.element.name in names)


def sized_models(ctx: Context) -> dict[str, T.ModelT]:
    """The model types a program can build, by name: those declared with fixed sizes and each use of
    a generic one whose dims are sized (`Linear[D C]`)."""
    found = [m for m in ctx.models.values() if not m.params]
    found += [m for m in ctx.instances.values() if m.sized]
    return {m.name: m for m in found}


def define(ctx: Context, name: str, span: Span, what: str) -> bool:
    if name in ctx.defined:
        ctx.error("E0202", f"`{name}` is defined twice", span, f"a second {what} named `{name}`",
                  f"the first is at {ctx.defined[name]}; rename one of them")
        return False
    if name in BUILTIN_NAMES:
        ctx.error("E0202", f"`{name}` is a built-in name", span, "can't be redefined", "choose another name")
        return False
    ctx.defined[name] = span
    return True


def call_cycles(ctx: Context) -> None:
    """A function may not call itself, directly or through others: nothing in the language (no `if`
    on a value, no early `return`) could end the recursion. Each cycle is an E0405 at the call that
    closes it. The walk keeps its own stack, so a long chain of calls can't overflow Python's."""
    state: dict[str, str] = {}  # "open" while on the current path, then "done"
    for root in ctx.fns:
        if root in state:
            continue
        path, pending = [root], [iter(ctx.fns[root].calls)]
        state[root] = "open"
        while pending:
            callee = next(pending[-1], None)
            if callee is None:
                state[path.pop()] = "done"
                pending.pop()
            elif state.get(callee) == "open":
                recursion_error(ctx, path[path.index(callee):] + [callee])
            elif callee not in state and callee in ctx.fns:
                state[callee] = "open"
                path.append(callee)
                pending.append(iter(ctx.fns[callee].calls))


def recursion_error(ctx: Context, cycle: list[str]) -> None:
    caller, callee = cycle[-2], cycle[-1]
    span = ctx.fns[caller].calls[callee]
    end = ("nothing in the language could end the recursion: repeat a step with a loop, over a stack "
           "of models (`for block in m.blocks:`) or over a dataset's batches")
    if len(cycle) == 2:
        ctx.error("E0405", f"`{caller}` calls itself", span, "a recursive call", end)
    else:
        ctx.error("E0405", f"`{caller}` calls `{callee}`, which leads back to `{caller}`", span,
                  "closes the cycle", "the cycle: " + " -> ".join(cycle), end)


def signature(ctx: Context, node: A.Fn | A.Extern) -> FnInfo:
    generics: dict[str, D.Dim] = {}
    params: list[ParamInfo] = []
    seen: set[str] = set()
    for p in node.params:
        if p.name in seen:
            ctx.error("E0202", f"parameter `{p.name}` is listed twice", p.span)
        seen.add(p.name)
        t = resolve_type(ctx, p.type, generics, allow_generic=True)
        params.append(ParamInfo(p.name, t, p.mut, p))
    param_generics = set(generics)
    ret: T.Ty = T.NONE
    if node.ret is not None:
        ret = resolve_type(ctx, node.ret, generics, allow_generic=True)
        for name in set(generics) - param_generics:
            ctx.error("E0311", f"dim `{name}` of the result isn't given by any parameter", node.ret.span,
                      f"`{name}` is unknown at each call", similar(name, list(ctx.dim_values) + list(param_generics))
                      or f"use a dim of a parameter, or declare it with `dim {name} = ...`")
    kind = FnKind.FN if isinstance(node, A.Fn) else FnKind(node.kind)
    if isinstance(node, A.Extern) and not _PYTHON_TARGET.match(node.target):
        ctx.error("E0205", f'"{node.target}" isn\'t the name of a Python function', node.target_span,
                  "expected module.function", 'write it as "package.module.function"')
    elif isinstance(node, A.Extern) and not ctx.python and node.target not in STD_EXTERNS:
        ctx.error("E0701", f"`{node.kind} fn {node.name}` runs Python code, and this program is loaded with "
                  f"Python refused", node.span.to(node.name_span), "names Python code",
                  "write the function in ShapeScript; or, if you trust the module it names, load the program "
                  "with Python allowed: `ss.load(path)` (python=True, the default), `shapescript run` without "
                  "`--no-python`",
                  secondary=((node.target_span, "the function it would import and call"),))
    for info in params:
        if isinstance(info.ty, T.AxisArgT) and kind != FnKind.EXTERN:
            ctx.error("E0401", f"an `Axis[...]` parameter belongs to an extern fn, not to a {kind} fn",
                      info.node.type.span, "not allowed here", "use `over=` with the built-in operations")
    return FnInfo(node.name, kind, node, params, ret, generics)


