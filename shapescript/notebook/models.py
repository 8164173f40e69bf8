"""A model as the notebook shows it: a table of its params and buffers, and a param's values on
demand.

The table comes from the model's spec (runtime/model.py's ParamSpec: name, shape, dtype), so
showing a RemoteModel fetches nothing from its workers; only `leaf_value` (the widget's "show
values" button) reads a tensor, worker 0's copy for a RemoteModel. The extension registers
`model_html` as IPython's HTML display of both (runtime/ knows nothing of the notebook); nothing
here imports IPython or ipywidgets.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypeGuard, Union

import sympy
import torch

from ..plan.sizes_text import bytes_text
from ..runtime.model import ModelSpec, ParamSpec, dtype_name, leaves, shape_text, type_text
from . import markup as M

if TYPE_CHECKING:
    from ..parallel.remote import RemoteModel
    from ..runtime.model import Model

AnyModel = Union["Model", "RemoteModel"]
FIRST = 8  # how many of a param's values "show values" lists


def is_remote(m: AnyModel) -> TypeGuard[RemoteModel]:
    from ..parallel.remote import RemoteModel  # imported here: runtime/model.py calls this module
    return isinstance(m, RemoteModel)


def _bytes(leaf: ParamSpec) -> int:
    return math.prod(leaf.shape) * leaf.dtype.itemsize


def _device_bytes(m: AnyModel, name: str, leaf: ParamSpec) -> int:
    """A leaf's bytes on each device: its part of it where each holds a part (the layout options)."""
    where = layout(m, name) if is_remote(m) else ""
    count = m._program.devices.count if is_remote(m) else 1
    if where.startswith("split along"):
        return _bytes(leaf) // count
    if where == "a piece on each device":
        return math.ceil(math.prod(leaf.shape) / count) * leaf.dtype.itemsize
    return _bytes(leaf)


def _size(n: int) -> str:
    return bytes_text(sympy.Integer(n))  # the DeviceTable's wording: "813,056 bytes (794 KiB)"


def workers_gone(m: AnyModel) -> bool:
    """A RemoteModel whose workers have stopped (its values are gone); asks the workers nothing."""
    if not is_remote(m):
        return False
    pool = m._program._pool
    return pool is not m._pool or pool is None or not pool.alive


def layout(m: AnyModel, name: str) -> str:
    """Where a param lies: for a RemoteModel every device's copy, or with the program's layout options
    each device's part of it; for a Model the tensor's device."""
    if not is_remote(m):
        return f"on {m._leaf(name).device}"
    devices = m._program.devices
    owner, leaf = _owner(m.spec, name)
    checked = getattr(m._program, "checked", None)
    if devices.split and checked is not None and (owner, leaf.name) in checked.module.head_params:
        return f"split along {devices.split}"
    if devices.shard_params and leaf.kind == "param":
        return "a piece on each device"
    return "a copy on every device"


def _owner(spec: ModelSpec, dotted: str) -> tuple[str, ParamSpec]:
    """The name of the model type that declares leaf `dotted` (`blocks.0.attn.w_o`), and the leaf."""
    for part in dotted.split("."):
        if part.isdigit():
            continue  # a stack's index
        member = next(mm for mm in spec.members if mm.name == part)
        if isinstance(member, ParamSpec):
            return spec.name, member
        spec = member.model
    raise KeyError(dotted)


def _held(m: RemoteModel) -> str:
    """How a RemoteModel's params lie, in a few words, from the program's layout options."""
    devices = m._program.devices
    if devices.shard_params:
        return "a piece of every param on each device"
    if devices.split:
        return f"its params with {devices.split} split along it"
    return "a copy on every device"


def title(m: AnyModel) -> str:
    """`Mlp on cpu[0 1], a copy on every device: 2 params, 813,056 bytes (794 KiB) on each device`."""
    members = list(leaves(m.spec))
    params = sum(1 for _, leaf in members if leaf.kind == "param")
    buffers = len(members) - params
    counts = f"{params} param{'' if params == 1 else 's'}" + (
        f" and {buffers} buffer{'' if buffers == 1 else 's'}" if buffers else "")
    total = _size(sum(_device_bytes(m, name, leaf) for name, leaf in members))
    if is_remote(m):
        gone = "; its workers have stopped, and its values are gone" if workers_gone(m) else ""
        return f"{m.spec.name} on {m._program.devices}, {_held(m)}: {counts}, {total} on each device{gone}"
    where = layout(m, members[0][0]).removeprefix("on ") if members else "no device"
    return f"{m.spec.name} on {where}: {counts}, {total}"


def model_html(m: AnyModel) -> str:
    """The title, and `<table class="ss-model-table">`: a row per param and buffer."""
    rows = [M.header(["name", "kind", "shape", "dtype", "layout", "bytes" + (" per device" if is_remote(m) else "")])]
    for name, leaf in leaves(m.spec):
        cells = [M.code(name), leaf.kind, shape_text(leaf.shape), dtype_name(leaf.dtype),
                 layout(m, name), _size(_device_bytes(m, name, leaf))]
        rows.append(M.row([c if c.startswith("<code>") else M.esc(c) for c in cells], cls="ss-member",
                          numeric=[5], title=f"declared at {leaf.where}"))
    return f"{M.STYLE}<div><b>{M.esc(title(m))}</b></div>{M.table('ss-model-table', rows)}"


def leaf_value(m: AnyModel, name: str) -> torch.Tensor:
    """A param or buffer by its dotted name: a Model's own tensor; for a RemoteModel worker 0's copy
    (`getattr(m, name)` for a member of its own, the state dict for a sub-model's)."""
    names = [n for n, _ in leaves(m.spec)]
    if name not in names:
        raise KeyError(f"model {m.spec.name} has no param or buffer `{name}`; it has {', '.join(names)}")
    if not is_remote(m):
        return m._leaf(name)
    if "." not in name:
        return getattr(m, name)
    return m.state_dict()[name]  # the workers read sub-models whole


def _number(x: float) -> str:
    return f"{x:.4g}"


def summary(m: AnyModel, name: str, first: int = FIRST) -> str:
    """A param's values in a few lines: its type, mean, std, min, max and its first values."""
    t = leaf_value(m, name).detach()
    source = " (worker 0's copy)" if is_remote(m) else ""
    head = f"{name}: {type_text(t.shape, t.dtype)}{source}"
    if t.numel() == 0:
        return f"{head}\nno values"
    x = t.to(torch.float64).cpu().flatten()  # ints and bools too; f64 so that the sums don't round
    std = _number(x.std().item()) if x.numel() > 1 else "-"
    stats = (f"mean {_number(x.mean().item())}  std {std}  min {_number(x.min().item())}  "
             f"max {_number(x.max().item())}")
    shown = ", ".join(_number(v) for v in x[:first].tolist())
    count = f"first {min(first, x.numel())} of {x.numel():,}" if x.numel() > first else "values"
    return f"{head}\n{stats}\n{count}: [{shown}]"
