"""The standard library's Python functions, for `extern fn` declarations such as

    extern fn std_layer_norm(x: [n D], over: Axis[D]) -> [n D] = "shapescript.std.layer_norm"

An `Axis[...]` parameter arrives as the index of that axis in the first tensor argument. `layer_norm`
and `rms_norm` are built-in operations now (ops/norms.py), with affine params, called as they are
without a declaration; these stay for programs that declare them under another name (ir/fuse.py
still fuses `layer_norm`'s gain and bias).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_norm(x: torch.Tensor, over: int, eps: float = 1e-5) -> torch.Tensor:
    """Normalize each vector along axis `over` to mean 0 and variance 1 (torch's layer_norm)."""
    if over in (-1, x.dim() - 1):
        return F.layer_norm(x, (x.shape[-1],), eps=eps)
    moved = x.movedim(over, -1)
    return F.layer_norm(moved, (moved.shape[-1],), eps=eps).movedim(-1, over)


def rms_norm(x: torch.Tensor, over: int, eps: float = 1e-6) -> torch.Tensor:
    """Scale each vector along axis `over` to unit root-mean-square (torch's rms_norm)."""
    moved = x.movedim(over, -1)
    return F.rms_norm(moved, (moved.shape[-1],), eps=eps).movedim(-1, over)
