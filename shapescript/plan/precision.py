"""Each value's compute dtype under `precision mixed bf16`: what torch.autocast makes of it on the
program's devices, which the DeviceTable counts the bytes sent in (plan/comms.py).

The types the checker gives stay the ones written (f32 where no dtype is written): the params, the
optimizer's state, a function's arguments and results. Inside a function on the devices, autocast
decides each op's dtype, as the op table's `autocast` says (ops/table.py's Autocast): products and
convolutions compute in bf16, losses in f32, softmax, norms and sums in f32 on a cuda device (torch's
lists differ by device), everything else as its tensor operands, the widest of them (bf16 with f32
is f32, as torch promotes). A function's result leaves in its written dtype (runtime/ops.py's
`mixed_precision`), so a call's value is of the callee's written type. Without `precision mixed`,
every value's compute dtype is its type's.
"""

from __future__ import annotations

import dataclasses

from ..dtypes import FLOAT_DTYPES
from ..ir import nodes as N
from ..ir.walk import statements
from ..ops.table import OPS, Autocast
from ..shapes import value_types as T

WIDTH = {"f16": 0, "bf16": 0, "f32": 1, "f64": 2}  # torch's promotion among floats: the widest wins


class ComputeDtypes:
    """The compute dtype of each value of a planned module's functions."""

    def __init__(self, module: N.Module) -> None:
        self.mixed = module.mixed
        self.cuda = module.devices.kind == "cuda"
        self._names: dict[str, dict[str, str]] = {}  # by function: each variable's, as last assigned

    def of(self, fn: N.Function, node: N.Expr) -> str | None:
        """`node`'s dtype as it is computed on the devices (None: not a tensor)."""
        written = node.ty.dtype if isinstance(node.ty, T.TensorT) else None
        if self.mixed is None or written not in FLOAT_DTYPES:
            return written
        if isinstance(node, N.Name):
            return self.names(fn).get(node.id, written)
        if isinstance(node, (N.Member, N.FnCall, N.GradCall, N.Const, N.Size)):
            return written  # a param as kept, a call's result as its callee wrote it
        if (isinstance(node, N.BinOp) and node.op == "@") or isinstance(node, N.Attention):
            kind = Autocast.LOWER  # a product; fused attention is torch's scaled_dot_product_attention
        elif isinstance(node, N.LayerNorm):
            kind = Autocast.FP32_ON_CUDA
        else:
            kind = OPS[node.op].autocast if isinstance(node, N.OpCall) else Autocast.FOLLOW
        if kind == Autocast.LOWER:
            return self.mixed
        if kind == Autocast.FP32 or (kind == Autocast.FP32_ON_CUDA and self.cuda):
            return "f32"
        operands = [self.of(fn, e) for e in _operands(node)]
        floats = [d for d in operands if d in WIDTH]
        return max(floats, key=WIDTH.__getitem__) if floats else written

    def names(self, fn: N.Function) -> dict[str, str]:
        """Each variable of `fn` as the statements assign it (a tuple's parts as written)."""
        if fn.name not in self._names:
            found: dict[str, str] = {}
            self._names[fn.name] = found
            for s in statements(fn.body):
                if isinstance(s, N.Assign) and len(s.targets) == 1:
                    dtype = self.of(fn, s.value)
                    if dtype is not None:
                        found[s.targets[0].name] = dtype
        return self._names[fn.name]


def _operands(node: N.Expr) -> list[N.Expr]:
    """The tensor operands an op's result follows: every expression argument with a tensor type."""
    out: list[N.Expr] = []
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, N.Expr) and isinstance(v.ty, T.TensorT):
                out.append(v)
    return out
