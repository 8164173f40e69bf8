"""The layout options' plan (`shard params`; `split H` to come): which reads of a param are
gathered from the devices' pieces. Worked out once, after placement, for elaboration (which prints
each read as a gather) and the DeviceTable (which counts what each one sends) alike."""

from __future__ import annotations

import sympy

from ..syntax import ast as A
from . import types as T
from .ops.table import numel
from .program import NO_LAYOUT, Checked, LayoutFacts, ShardedRead
from .split import iter_nodes


def lay_out(checked: Checked) -> LayoutFacts:
    """On several devices with `shard params`, every read of a param in a function on the workers
    gathers it: each device holds ceil(n / N) of its n values, the last device's piece padded."""
    devices = checked.device_set
    if devices.count == 1 or not devices.shard_params:
        return NO_LAYOUT
    reads: dict[int, ShardedRead] = {}
    for fn in checked.fns.values():
        if fn.kind != "fn" or checked.placement(fn.name).where != "workers":
            continue
        for node in iter_nodes(fn.node):
            if not isinstance(node, A.Attr):
                continue
            owner = checked.types.get(id(node.obj))
            member = owner.members.get(node.name) if isinstance(owner, T.ModelT) else None
            if isinstance(owner, T.ModelT) and member is not None and member.kind == "param" and member.tensor is not None:
                padded = sympy.ceiling(numel(member.tensor) / devices.count) * devices.count
                reads[id(node)] = ShardedRead(owner.name, member.name, member.tensor.dtype, padded)
    return LayoutFacts(reads)
