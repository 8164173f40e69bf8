"""Standard-library operations that are more than one torch call: gradient norms and clipping,
the causal mask, and `first` with its check of the count."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from shapescript.errors import ShapeError
from shapescript.runtime.collectives import (
    BATCH_NORM_EPS,
    BATCH_NORM_MOMENTUM,
    all_sum,
    caller_location,
    check_statistics_count,
    running_statistics,
)
from shapescript.runtime.optim import Grads

if TYPE_CHECKING:
    from shapescript.runtime.data import Batch
    from shapescript.runtime.modes import Mode


def grad_norm(g: Grads, where: str = "norm") -> torch.Tensor:
    """The 2-norm of all of a model's gradients together, as torch's clip_grad_norm_ measures it.
    Of sharded gradients: every worker's pieces' squares added up (one all-reduce of one number)."""
    g = g.synced(where)
    if not any(g.pieces):
        return torch.nn.utils.get_total_norm(g.tensors)
    parts = torch.nn.utils.get_total_norm([t for t, part in zip(g.tensors, g.pieces) if part])
    squares = all_sum(parts.reshape(1) ** 2, where).reshape(())
    whole = [t for t, part in zip(g.tensors, g.pieces) if not part]
    if whole:
        squares = squares + torch.nn.utils.get_total_norm(whole).to(squares.dtype) ** 2
    return squares.sqrt()


def clip_norm(g: Grads, max_norm: float, where: str = "clip_norm") -> Grads:
    """The gradients scaled down so that their norm is at most `max_norm` (torch's clip_grad_norm_
    formula, without changing them in place)."""
    total = grad_norm(g, where)
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return Grads(g.model_spec, [t * scale for t in g.tensors], g.pieces)


def affine_layer_norm(x: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """layer_norm over the last axis, times `gain`, plus `bias`: torch's one kernel (ir/fuse.py). A
    function of its own so that each argument is evaluated once (a sharded gain is gathered once)."""
    return torch.nn.functional.layer_norm(x, gain.shape, gain, bias)


def _along_last(x: torch.Tensor, axis: int, norm: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`norm` of x's vectors along `axis`, which torch's norms take last: moved there and back."""
    if axis in (-1, x.dim() - 1):
        return norm(x)
    return norm(x.movedim(axis, -1)).movedim(-1, axis)


def layer_norm(x: torch.Tensor, axis: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float) -> torch.Tensor:
    """The built-in layer_norm along `axis`, with its affine params where given: torch's one kernel."""
    return _along_last(x, axis, lambda v: torch.nn.functional.layer_norm(v, v.shape[-1:], weight, bias, eps))


def rms_norm(x: torch.Tensor, axis: int, weight: torch.Tensor | None, eps: float | None) -> torch.Tensor:
    """The built-in rms_norm along `axis` (eps None: torch's, the machine epsilon of x's dtype)."""
    return _along_last(x, axis, lambda v: torch.nn.functional.rms_norm(v, v.shape[-1:], weight, eps))


def group_norm(x: torch.Tensor, groups: int, axis: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float, where: str) -> torch.Tensor:
    """The built-in group_norm of x's channels along `axis`, in `groups` groups, with every axis
    after them: torch's (N, C, *), the axes before the channels made one (N) and put back after."""
    channels = x.shape[axis]
    if channels % groups:
        raise ShapeError(f"{where}: `group_norm` splits {channels} channels into {groups} groups; "
                         f"give it channels that are a multiple of {groups}")
    if weight is None and bias is not None:  # torch 2.13's group_norm backward fails on a bias without a weight
        weight = torch.ones_like(bias)  # times 1: the same values and gradients
    lead = x.shape[:axis]
    flat = x if axis == 1 else x.reshape(math.prod(lead), *x.shape[axis:])
    out = torch.nn.functional.group_norm(flat, groups, weight, bias, eps)
    return out if axis == 1 else out.reshape(x.shape)


def causal(rows: int, cols: int, device: torch.device | str) -> torch.Tensor:
    """True where a column lies after its row: the future, which a causal model must not see."""
    return torch.ones(rows, cols, dtype=torch.bool, device=device).triu(1)


def causal_mask(rows: int, cols: int, device: torch.device | str) -> torch.Tensor:
    """`causal`, made once per size and device: the generated code calls this only where the mask
    is read as a mask and goes nowhere else, so that no one can change the shared tensor. A size
    that is symbolic (traced by torch.export with a dynamic length) makes a mask in the graph."""
    if type(rows) is not int or type(cols) is not int:
        return causal(rows, cols, device)
    return _shared_causal_mask(rows, cols, device)


@functools.lru_cache(maxsize=64)
def _shared_causal_mask(rows: int, cols: int, device: torch.device | str) -> torch.Tensor:
    """Made outside inference mode, so that autograd can save it when a training step reads it."""
    with torch.inference_mode(False):
        return causal(rows, cols, device)


def first(x: torch.Tensor, count: int, axis: int, names: tuple[str, str], where: str) -> torch.Tensor:
    """x's first `count` entries along `axis`. The checker proved count <= the axis's size where it
    knew both; a generic count is checked here, so that too many is our error and not torch's."""
    size = x.shape[axis]
    if count > size:
        counted, along = names
        counted = counted if counted == str(count) else f"{counted} = {count}"
        raise ShapeError(f"{where}: `first` takes {counted} entries along {along}, which has only "
                         f"{size}; pass at most {size}")
    return x.narrow(axis, 0, count)


def topk(x: torch.Tensor, k: int, axis: int, along: str, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk along an axis whose size the checker didn't know (a generic dim): too few entries
    is our error, naming the .ss location, and not torch's."""
    size = x.shape[axis]
    if k > size:
        raise ShapeError(f"{where}: `topk` takes the {k} largest entries along {along}, which has only {size}")
    values, indices = torch.topk(x, k, dim=axis)
    return values, indices


def take(x: torch.Tensor, i: int | torch.Tensor, axis: int, along: str, where: str) -> torch.Tensor:
    """x at position `i` along `axis`, without that axis: a whole number (negative from the end)
    checked here, so that out of range is our error and not torch's; an `Index[...]` tensor is in range."""
    if isinstance(i, torch.Tensor):
        return x.index_select(axis, i.reshape(1)).squeeze(axis)
    size = x.shape[axis]
    if not -size <= i < size:
        raise ShapeError(f"{where}: `take` at position {i} along {along}, which has {size}: a position is in "
                         f"0..{size - 1}, or -{size}..-1 from the end")
    return x.select(axis, i)


def put(x: torch.Tensor, i: int | torch.Tensor, v: torch.Tensor, axis: int, along: str, where: str) -> torch.Tensor:
    """x with `v` at position `i` along `axis` (a new tensor: autograd sees both), `i` checked as
    `take` checks it."""
    size = x.shape[axis]
    if isinstance(i, torch.Tensor):
        index = i.reshape(1).to(x.device)
    elif not -size <= i < size:
        raise ShapeError(f"{where}: `put` at position {i} along {along}, which has {size}: a position is in "
                         f"0..{size - 1}, or -{size}..-1 from the end")
    else:
        index = torch.tensor([i % size], device=x.device)
    return x.index_copy(axis, index, v.unsqueeze(axis).to(x.dtype))


def window(x: torch.Tensor, start: int, count: int, axis: int, names: tuple[str, str], where: str) -> torch.Tensor:
    """x's `count` entries along `axis` from `start` (negative: from the end), checked as `first`'s are."""
    size = x.shape[axis]
    begin = start if start >= 0 else size + start
    if count > size or not 0 <= begin <= size - count:
        counted, along = names
        counted = counted if counted == str(count) else f"{counted} = {count}"
        raise ShapeError(f"{where}: `window` takes {counted} entries along {along} from {start}, which has {size}")
    return x.narrow(axis, begin, count)


def last(x: torch.Tensor, count: int, axis: int) -> torch.Tensor:
    """x's last `count` entries along `axis`, or all of them where it has fewer (nanoGPT's crop of
    the context to the block size)."""
    size = x.shape[axis]
    return x.narrow(axis, max(0, size - count), min(size, count))


def conv(x: torch.Tensor, w: torch.Tensor, spatial: int, stride: int, padding: int, dilation: int,
         groups: int) -> torch.Tensor:
    """torch's conv1d or conv2d of x's trailing channel and spatial axes, its leading axes (any
    number, the batch's among them) taken as the batch."""
    lead = x.shape[:-spatial - 1]
    flat = x.reshape(-1, *x.shape[-spatial - 1:])
    run = torch.nn.functional.conv1d if spatial == 1 else torch.nn.functional.conv2d
    out = run(flat, w, None, stride, padding, dilation, groups)
    return out.reshape(*lead, *out.shape[1:])


def conv_transpose(x: torch.Tensor, w: torch.Tensor, stride: int, padding: int, output_padding: int,
                   dilation: int, groups: int) -> torch.Tensor:
    """torch's conv_transpose2d of x's last three axes (channels, then two spatial), as `conv`."""
    lead = x.shape[:-3]
    out = torch.nn.functional.conv_transpose2d(x.reshape(-1, *x.shape[-3:]), w, None, stride, padding,
                                               output_padding, groups, dilation)
    return out.reshape(*lead, *out.shape[1:])


def adaptive_pool(x: torch.Tensor, kind: str, size: tuple[int, int]) -> torch.Tensor:
    """torch's adaptive_avg_pool2d or adaptive_max_pool2d over x's last two axes."""
    flat = x.reshape(-1, 1, *x.shape[-2:])
    if kind == "max":
        out = torch.nn.functional.adaptive_max_pool2d(flat, size)
    else:
        out = torch.nn.functional.adaptive_avg_pool2d(flat, size)
    return out.reshape(*x.shape[:-2], *size)


def pool(x: torch.Tensor, kind: str, k: int, stride: int, padding: int) -> torch.Tensor:
    """torch's max_pool2d or avg_pool2d over x's last two axes, each leading entry by itself."""
    lead = x.shape[:-2]
    flat = x.reshape(-1, 1, *x.shape[-2:])
    if kind == "max":
        out = torch.nn.functional.max_pool2d(flat, k, stride, padding)
    else:
        out = torch.nn.functional.avg_pool2d(flat, k, stride, padding)
    return out.reshape(*lead, *out.shape[-2:])


def batch_norm(x: torch.Tensor, stats: object, mode: Mode, axis: int) -> torch.Tensor:
    """PyTorch's batch_norm with the channels on `axis`: batch statistics and a momentum update of
    the running ones in Train, the running ones in Eval."""
    if mode.training and x.numel() == x.shape[axis]:  # our error, not torch's
        check_statistics_count(1, caller_location())
    moved = x if axis == 1 else x.movedim(axis, 1)
    out = torch.nn.functional.batch_norm(moved, *running_statistics(stats), training=mode.training,
                                         momentum=BATCH_NORM_MOMENTUM, eps=BATCH_NORM_EPS)
    return out if axis == 1 else out.movedim(1, axis)


def valid(batch: Batch, label: str) -> torch.Tensor:
    """[b n] bool: true where an item has its own values along the padded dim `label`."""
    spec = batch.spec
    size = next(getattr(batch, f.name).shape[1 + k] for f in spec.fields
                for k, (name, fixed) in enumerate(f.dims) if name == label and fixed is None)
    lengths = batch.lengths.get(label)
    if lengths is None:  # a batch from Python, or stacked by the dataset itself: nothing padded
        first = getattr(batch, spec.fields[0].name)
        return torch.ones(batch.size, size, dtype=torch.bool, device=first.device)
    return torch.arange(size, device=lengths.device)[None, :] < lengths[:, None]


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None) -> torch.Tensor:
    kept = x * mask
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None) -> torch.Tensor:
    """The mean of the values where `mask` holds (over one axis, or all)."""
    weights = mask.expand_as(x).to(x.dtype)
    if dim is None:
        return (x * weights).sum() / weights.sum()
    return (x * weights).sum(dim) / weights.sum(dim)


def masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """cross_entropy's mean over the labels where `mask` holds."""
    losses = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    weights = mask.to(losses.dtype)
    return (losses * weights).sum() / weights.sum()


def mixed_precision(compute: str, declared: object) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """`precision mixed bf16`'s wrapper of a fn on the devices: its body runs under torch.autocast in
    `compute` (a torch dtype's name) on its module's DEVICE, and its float results leave as `declared`
    (the dtype name of its return type, a tuple of them for a tuple, None for anything else), the
    types the program wrote: a result autocast left in bf16 is widened to f32, which is exact."""
    dtype = getattr(torch, compute)

    def wrap(fn: Callable[..., object]) -> Callable[..., object]:
        namespace = fn.__globals__

        @functools.wraps(fn)
        def run(*args: object) -> object:
            device = str(namespace["DEVICE"])  # read at each call: the loader sets a worker's
            cuda = device.startswith("cuda")
            # A step recorded as a CUDA graph keeps no cast of a weight from outside the capture (as
            # torch's CUDA-graph notes ask): autocast's cache of casts is off while one is captured.
            cache = not (cuda and torch.cuda.is_current_stream_capturing())
            with torch.autocast("cuda" if cuda else "cpu", dtype=dtype, cache_enabled=cache):
                result = fn(*args)
            return as_declared(result, declared)
        return run
    return wrap


def as_declared(value: object, declared: object) -> object:
    """A result in the dtypes its type declares (only floats change: autocast changes nothing else)."""
    if isinstance(value, torch.Tensor) and isinstance(declared, str):
        want = getattr(torch, declared)
        return value.to(want) if value.dtype != want and value.is_floating_point() else value
    if isinstance(value, tuple) and isinstance(declared, tuple):
        return tuple(as_declared(v, d) for v, d in zip(value, declared))
    return value


def tf32_products(fn: Callable[..., object]) -> Callable[..., object]:
    """`precision tf32`'s wrapper of a fn on the devices: while it runs (and so while a step of it is
    recorded), a GPU's f32 products and convolutions may use TF32 (torch.backends' allow_tf32 flags,
    set for the call and put back after it). The CPU's products are torch's f32 ones either way."""
    @functools.wraps(fn)
    def run(*args: object) -> object:
        matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
        was = matmul.allow_tf32, cudnn.allow_tf32
        matmul.allow_tf32 = cudnn.allow_tf32 = True
        try:
            return fn(*args)
        finally:
            matmul.allow_tf32, cudnn.allow_tf32 = was
    return run
