"""Matrix products on the CPU: oneDNN's kernels where they are measured quicker than torch's default.

A float32 `x @ w` on the CPU runs MKL's sgemm in torch. On AMD CPUs MKL's kernels are often slower
than those of oneDNN, the other matrix library torch ships (the one its CPU compiler uses for
linear layers): on the AMD EPYC (Zen 4) these figures come from, a [3072 784] @ [784 256] product
took 12.6 ms through oneDNN against 20.1 ms through MKL on one thread, and a product with a narrow
result such as [3072 256] @ [256 10] a quarter of MKL's time (`benchmarks/products.py` prints the
table). So `@` between a float32 matrix (or a stack of rows, [.. k]) and a float32 [k n] matrix on
the CPU is lowered to `matmul`, which sends each product, the two of its backward included, to the
library that measured quicker for its sizes (`onednn_for`):

- a product A[m k] @ B[k n] to oneDNN when m >= 256, k >= 256 and m k n >= 2**21; below that,
  oneDNN's call costs more than it saves (about 15 µs a call) or MKL is as quick;
- a weight's gradient A^T @ G to oneDNN only when the result is narrow (n <= 16, with m >= 256 rows
  and m k >= 2**16): MKL is as quick or quicker otherwise.

Where: AMD CPUs (`vendor`), with torch's oneDNN present and enabled (`torch.backends.mkldnn`). On
others, torch's product as written: no measurement here says oneDNN would be quicker there.
`SHAPESCRIPT_MATMUL=onednn` or `=torch` decides for every CPU (A/B runs, tests), read as this module
is imported (each worker imports it as it starts). The products are the same sums in another
order: they agree with MKL's to float32 rounding (about 1e-6 relative), which is all a change of
device count or thread count promises as well; every device of a program makes the same choice for
the same sizes.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from typing import Protocol

import torch

ENV = "SHAPESCRIPT_MATMUL"
MIN_ROWS = 256  # m: below this oneDNN's per-call cost outweighs it
MIN_INNER = 256  # k
MIN_MACS = 1 << 21  # m k n
NARROW = 16  # a weight gradient's n at most, for oneDNN
MIN_NARROW_MK = 1 << 16


def vendor() -> str:
    """The CPU's vendor string ("AuthenticAMD", "GenuineIntel"), "" where /proc/cpuinfo says none."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _linear_op() -> Callable[..., torch.Tensor] | None:
    """torch's oneDNN linear kernel on plain strided tensors (what torch.compile lowers linear layers
    to on the CPU), or None where this torch has none."""
    if not torch.backends.mkldnn.is_available() or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    return getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)


def _setting() -> str:
    return os.environ.get(ENV, "auto").strip().lower()


def choose(setting: str, cpu_vendor: str, kernel: bool) -> bool:
    """Whether this process sends products to oneDNN: `setting` is SHAPESCRIPT_MATMUL's ("auto",
    "onednn", "torch"), `kernel` whether torch has oneDNN's linear op here."""
    return kernel and (setting == "onednn" or (setting == "auto" and cpu_vendor == "AuthenticAMD"))


_LINEAR = _linear_op()
ENABLED = choose(_setting(), vendor(), _LINEAR is not None)


def onednn_for(m: int, k: int, n: int) -> bool:
    """Whether A[m k] @ B[k n] goes to oneDNN (the rule in the module's note)."""
    return m >= MIN_ROWS and k >= MIN_INNER and m * k * n >= MIN_MACS


def onednn_for_weight_grad(m: int, k: int, n: int) -> bool:
    """Whether A[m k]^T @ G[m n], a weight's gradient, goes to oneDNN."""
    return n <= NARROW and m >= MIN_ROWS and m * k >= MIN_NARROW_MK


def _on(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (ENABLED and b.dim() == 2 and a.dim() >= 2 and a.dtype is torch.float32 and b.dtype is torch.float32
            and a.device.type == "cpu" and b.device.type == "cpu" and a.layout is torch.strided
            and b.layout is torch.strided and torch._C._get_mkldnn_enabled())


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` for a [.. k] and b [k n], by the library the rule picks; torch's `@` for anything else."""
    if not _on(a, b):
        return a @ b
    k, n = b.shape
    if not onednn_for(a.numel() // k if k else 0, k, n):
        return a @ b
    if (a.requires_grad or b.requires_grad) and torch.is_grad_enabled():
        return _Product.apply(a, b)
    return _onednn(a, b)


def _onednn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b through oneDNN: its linear op computes input @ weight^T, with the weight as [n k]."""
    rows = a.reshape(-1, a.shape[-1]) if a.dim() > 2 else a
    assert _LINEAR is not None  # called only where `_on`: ENABLED, which needs the kernel
    try:
        out = _LINEAR(rows.contiguous(), b.t(), None, "none", [None], "")
    except RuntimeError:  # a layout or size oneDNN refuses: torch's product, which the rule only meant to beat
        return a @ b
    return out.view(*a.shape[:-1], b.shape[1]) if a.dim() > 2 else out


def _weight_grad(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """A^T @ G over every row of a [.. k] and g [.. n]: the gradient of b in a @ b, in b's layout."""
    rows, grads = a.reshape(-1, a.shape[-1]), g.reshape(-1, g.shape[-1])
    (m, k), n = rows.shape, grads.shape[1]
    if _on(rows, grads) and onednn_for_weight_grad(m, k, n) and not torch.is_grad_enabled():
        return onednn_weight_grad(rows, grads)  # (not when a gradient of this is asked for: `@` records it)
    return rows.t() @ grads


def onednn_weight_grad(rows: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """rows^T @ grads through oneDNN as (G^T A)^T: G^T its input, A^T its weight [k m], the result
    [n k] transposed into b's layout; torch's product where oneDNN refuses."""
    assert _LINEAR is not None  # called only where `_on`: ENABLED, which needs the kernel
    try:
        return _LINEAR(grads.t(), rows.t(), None, "none", [None], "").t().contiguous()
    except RuntimeError:
        return rows.t() @ grads


class _ProductCtx(Protocol):
    """A backward's ctx as _Product reads it (torch's stubs type both as 1-tuples)."""

    saved_tensors: tuple[torch.Tensor, ...]
    needs_input_grad: tuple[bool, ...]


class _Product(torch.autograd.Function):
    """a @ b by oneDNN, with a backward whose products pick their library by the same rule. Its
    backward is made of differentiable calls (matmul, or `@` where a gradient of it is asked for),
    so a gradient of a gradient still works."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return _onednn(a, b)

    @staticmethod
    def backward(ctx: _ProductCtx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        grad_a = matmul(grad, b.t()) if need_a else None
        grad_b = _weight_grad(a, grad) if need_b else None
        return grad_a, grad_b
