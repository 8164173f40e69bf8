"""Operations across the batch axis on several devices: each worker holds a part of the batch, and
these combine the parts with one all-reduce, so every worker gets the whole batch's result. On one
device (no process group) they are the plain operations.

Gradients: `all_sum`'s backward is an all-reduce too (so a collective that value_and_grad
differentiates runs twice, once each way), and `value_and_grad` averages the workers' gradients
(one all-reduce per dtype). The loss is the same on every worker, so each worker's part of a sum
over the batch gets the gradient N times, which the average takes back; a term every worker
computes whole (say a penalty on the params) counts once, not once per worker.

As DDP does, the gradients' all-reduce is sent in buckets started during the backward pass as their
gradients become ready (`BucketedAverage`), so that it overlaps the rest of the backward; it is
still recorded once per dtype, as the one collective the DeviceTable counts, and waited for inside
`waiting_at`. `SHAPESCRIPT_OVERLAP=off` sends it after the backward, in one piece per dtype.

Workers that are processes of one machine on cpu[...] sum through shared memory instead of Gloo
(`shm`, runtime/shm_reduce.py): the same sums, many times quicker. Such a sum holds the worker's
core while it runs, so there is nothing to overlap: the gradients go after the backward, as with
`SHAPESCRIPT_OVERLAP=off`.

Every collective a call of the program starts goes through `collective` (here, in runtime/sharding.py
and runtime/heads.py), which notes it in the call's `CallCollectives` when a worker keeps them
(runtime/ledger.py), and `agree_to_update` is every worker's word, before an update, that none has
failed in the step: so that a worker that raised an error of its own can join the collectives its
peers still wait in, and none updates (docs/several-devices.md, "An error on one worker").
"""

from __future__ import annotations

import enum
import os
import sys
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shapescript.errors import ShapeError
from shapescript.names import MEMBER_PREFIX
from shapescript.runtime.shm_reduce import SharedMemoryAllReduce
from shapescript.runtime.steps import StepSkipped

if TYPE_CHECKING:  # modes.py imports this module
    from shapescript.runtime.modes import Mode

# Set by a worker: a context manager around each collective, given its .ss location, so that a
# worker stuck there can be reported ("was waiting for the other workers at train.ss:30:12").
status_hook: Callable[[str], AbstractContextManager[object]] | None = None


# Set by a worker whose peers are processes of this machine (parallel/worker.py): every all-reduce
# of a tensor it can sum goes through shared memory rather than Gloo.
shm: SharedMemoryAllReduce | None = None


# Set by a test or a profiler: every collective is appended as (its .ss location, values, dtype,
# operation: "all-reduce", "all-gather", "reduce-scatter"). The DeviceTable (plan/comms.py) says
# beforehand what this will hold.
recorded: list[tuple[str, int, torch.dtype, str]] | None = None

# Set by a worker that times its calls (parallel/timeline.py): told each collective's operation
# just before it runs, for the timeline's columns.
operation_hook: Callable[[str], None] | None = None


# Set by a worker around each call: where its part lies in the whole batch, (offset, the whole
# batch's size), so that a random draw can be the whole batch's and each worker take its rows.
# None on one device and in a call with no split argument: a value's rows are all the batch's.
_batch_part: tuple[int, int] | None = None


class Op(enum.Enum):
    """What a collective does; FLAG is `agree_to_update`'s sum of the workers' failure flags."""
    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    FLAG = "flag"


class Issued(NamedTuple):
    """One collective as a worker started it: enough to start the same one again with zeros."""
    op: Op
    values: int  # how many values this worker sends: an all-gather's piece, a reduce-scatter's whole
    dtype: torch.dtype
    shared: bool  # an all-reduce through shared memory (shm), not Gloo
    where: str


class CallCollectives:
    """The collectives a call has started so far, in order, and how many of them have not ended:
    an exception that leaves `open` above 0 came out of a collective (a peer's failure, a timeout),
    not from the worker's own code. `careful`: in a call whose collectives the worker's ledger
    doesn't know, the workers' sum of failure flags, run before each collective (runtime/ledger.py)."""

    __slots__ = ("entries", "open", "careful")

    def __init__(self, careful: Callable[[], None] | None = None) -> None:
        self.entries: list[Issued] = []
        self.open = 0
        self.careful = careful


# Set by a worker around each call of the program (runtime/ledger.py): the collectives it starts.
issued: CallCollectives | None = None


class collective:
    """Around each collective the compiled code starts: noted in `issued`, and the worker's status
    says where it waits (`waiting_at`). A class, not a generator: it runs around every sum."""

    __slots__ = ("entry", "status", "noted")

    def __init__(self, op: Op | None, values: int, dtype: torch.dtype, where: str, shared: bool = False) -> None:
        """op None: a wait for collectives started before (BucketedAverage's), noted as none."""
        self.entry = Issued(op, values, dtype, shared, where) if op is not None else None
        self.status = waiting_at(where)
        self.noted: CallCollectives | None = None

    def __enter__(self) -> None:
        self.noted = issued
        if self.noted is not None:
            if self.noted.careful is not None and self.entry is not None and self.entry.op is not Op.FLAG:
                self.noted.careful()  # not noted: the ledger keeps the program's own collectives
            if self.entry is not None:
                self.noted.entries.append(self.entry)
            self.noted.open += 1
        self.status.__enter__()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.status.__exit__(kind, exc, tb)
        if self.noted is not None and kind is None:
            self.noted.open -= 1


# The worker's number of workers, set when its process group starts and cleared when it ends
# (parallel/worker.py): torch's own lookup costs several µs, and world() runs on every call and sum.
_world_size: int | None = None


def set_world(size: int | None) -> None:
    global _world_size
    _world_size = size


def world() -> int:
    if _world_size is not None:
        return _world_size
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class in_batch_part:
    """Run a call with this worker's part of the batch at (offset, whole batch's size). A class, not
    a generator: it runs around every call."""

    __slots__ = ("part", "was")

    def __init__(self, part: tuple[int, int] | None) -> None:
        self.part: tuple[int, int] | None = part
        self.was: tuple[int, int] | None = None

    def __enter__(self) -> None:
        global _batch_part
        self.was, _batch_part = _batch_part, self.part

    def __exit__(self, *exc: object) -> None:
        global _batch_part
        _batch_part = self.was


def batch_part() -> tuple[int, int] | None:
    """(offset of this worker's part, the whole batch's size) in the current call; None if unsplit."""
    return _batch_part


def caller_location(depth: int = 2) -> str:
    """The .ss location of the generated line `depth` frames up (its module's SS_LINES), for an error
    raised where the compiled code passes none (the all_* functions are given theirs)."""
    frame = sys._getframe(depth)
    lines, file = frame.f_globals.get("SS_LINES"), frame.f_globals.get("SS_FILE")
    if not isinstance(lines, dict) or frame.f_lineno not in lines:
        return "(compiled code)"
    line, col = lines[frame.f_lineno]
    return f"{file}:{line}:{col}"


def running_statistics(stats: object) -> tuple[torch.Tensor, torch.Tensor]:
    """batch_norm's running mean and var: the stats model's live buffers, which the update changes in
    place (reading `stats.mean` from Python gives a copy)."""
    return stats.__dict__[MEMBER_PREFIX + "mean"], stats.__dict__[MEMBER_PREFIX + "var"]


def check_statistics_count(count: int, where: str) -> None:
    """batch_norm in Train refuses a batch with one value per channel, as PyTorch does (the variance
    of one value is no statistic): on every device count alike, from the whole batch's count."""
    if count == 1:
        raise ShapeError(f"{where}: batch_norm in Train needs more than one value per channel for the "
                         f"batch's statistics, but this batch has 1; use a batch of 2 or more "
                         f"examples, or Eval, which uses the running statistics")


def waiting_at(where: str) -> AbstractContextManager[object]:
    """Around each collective: a worker stuck in it says where (`status_hook`)."""
    return status_hook(where) if status_hook is not None else nullcontext()


def record(where: str, values: int, dtype: torch.dtype, op: str) -> None:
    """Every collective of the compiled code is recorded here, when a test or a profiler asks."""
    if recorded is not None:
        recorded.append((where, values, dtype, op))
    if operation_hook is not None:
        operation_hook(op)


def _all_reduce(t: torch.Tensor, where: str) -> None:
    """A sum over the workers, in place: every all-reduce of the compiled code goes through here."""
    record(where, t.numel(), t.dtype, "all-reduce")
    shared = shm is not None and shm.can_sum(t)
    with collective(Op.ALL_REDUCE, t.numel(), t.dtype, where, shared):
        _sum(t, shared)


def _sum(t: torch.Tensor, shared: bool) -> None:
    if shared:
        assert shm is not None
        shm.all_reduce(t)
    else:
        dist.all_reduce(t)


UPDATE_WHERE = "the workers' word before an update"


def agree_to_update(device: torch.device, failed: bool = False, overflow: bool = False) -> bool:
    """Before an update (runtime/optim.py's before_update):
    the sum of every worker's failure flag, one int64, through shared memory where the workers sum
    there, else Gloo. Nonzero, a worker raised an error of its own in this call and joined the rest
    of its collectives with zeros (runtime/ledger.py): every worker raises StepSkipped, so that none
    changes a model. Not recorded (the DeviceTable counts the program's own collectives); skipped
    while a recorded step is captured, where nothing may wait for the host (runtime/recorded.py).
    `overflow`: whether this worker's gradients overflowed (`precision mixed f16`), summed in the same
    int64's high bits; answers whether any worker's did."""
    if world() == 1 or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return overflow
    return _sum_flags(device, failed, UPDATE_WHERE, noted=True, overflow=overflow)


def sum_flags(device: torch.device, failed: bool, where: str) -> None:
    """The same sum of the workers' failure flags as `agree_to_update`'s, not noted in the call's
    collectives: a careful call runs one before each collective and at its end (runtime/ledger.py).
    Raises StepSkipped where the sum is nonzero."""
    _sum_flags(device, failed, where, noted=False)


OVERFLOW = 1 << 32  # an overflow's flag, above any count of failed workers (at most MAX_DEVICES)


def _sum_flags(device: torch.device, failed: bool, where: str, noted: bool, overflow: bool = False) -> bool:
    """Noted: a collective of the call's (the ledger's Op.FLAG, which a failed worker joins too);
    else only where a stuck worker waits. Answers whether any worker flagged an overflow."""
    flag = torch.full((1,), int(failed) + OVERFLOW * int(overflow), dtype=torch.int64, device=device)
    shared = shm is not None and shm.can_sum(flag)
    with collective(Op.FLAG, 1, torch.int64, where, shared) if noted else waiting_at(where):
        _sum(flag, shared)
    total = int(flag.item())
    if total % OVERFLOW:
        raise StepSkipped("another worker raised an error of its own in this call")
    return total >= OVERFLOW


def join_with_zeros(entry: Issued, device: torch.device) -> None:
    """Start `entry`'s collective again, sending zeros: what a worker that failed in a call does for
    each collective its peers still start (runtime/ledger.py). Their results are never used: the
    flag before the update, or at the call's end, makes every worker skip the step."""
    zeros = torch.zeros(entry.values, dtype=entry.dtype, device=device)
    n = world()
    with waiting_at(entry.where):
        if entry.op is Op.ALL_REDUCE:
            _sum(zeros, entry.shared)
        elif entry.op is Op.ALL_GATHER:
            dist.all_gather_single(torch.empty(entry.values * n, dtype=entry.dtype, device=device), zeros)
        elif entry.op is Op.REDUCE_SCATTER:
            dist.reduce_scatter_single(torch.empty(entry.values // n, dtype=entry.dtype, device=device), zeros)
        else:
            raise ValueError(f"{entry.op} is joined by agree_to_update, not with zeros")


class _AllSum(torch.autograd.Function):
    """A sum over the workers whose backward is one as well: each worker's part gets the gradient
    of every use of the sum, its own and the other workers'."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, where: str) -> torch.Tensor:
        ctx.where = where
        y = x.detach().clone()
        _all_reduce(y, where)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        total = grad.detach().clone()
        _all_reduce(total, ctx.where)
        return total, None


def all_sum(x: torch.Tensor, where: str = "") -> torch.Tensor:
    """The sum of every worker's `x` (each worker's part of a sum over the batch)."""
    return _AllSum.apply(x, where) if world() > 1 else x


def _sum_and_count(total: torch.Tensor, count: torch.Tensor | float, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """All-reduce a partial sum and its count together: one collective."""
    # A number is filled in on the device: a tensor made from it would be copied from the host, which
    # a recorded step's capture refuses (runtime/recorded.py)
    count_t = (count.to(total.device, total.dtype).reshape(1) if isinstance(count, torch.Tensor)
               else torch.full((1,), count, dtype=total.dtype, device=total.device))
    packed = all_sum(torch.cat([total.reshape(-1), count_t]), where)
    return packed[:-1].reshape(total.shape), packed[-1]


def all_mean(x: torch.Tensor, dim: int | None, where: str = "") -> torch.Tensor:
    total = x.sum() if dim is None else x.sum(dim)
    count = x.numel() if dim is None else x.shape[dim]
    s, n = _sum_and_count(total, float(count), where)
    return s / n


def all_masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None, where: str = "") -> torch.Tensor:
    weights = mask.expand_as(x).to(x.dtype)
    total = (x * weights).sum() if dim is None else (x * weights).sum(dim)
    count = weights.sum() if dim is None else weights.sum(dim)
    if dim is None:
        s, n = _sum_and_count(total, count.detach(), where)
        return s / n
    packed = all_sum(torch.stack([total, count.detach()]), where)
    return packed[0] / packed[1]


def all_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, where: str = "") -> torch.Tensor:
    s, n = _sum_and_count(F.cross_entropy(logits, labels, reduction="sum"), float(labels.numel()), where)
    return s / n


def all_masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
                             where: str = "") -> torch.Tensor:
    weights = mask.to(logits.dtype)
    losses = F.cross_entropy(logits, labels, reduction="none")
    s, n = _sum_and_count((losses * weights).sum(), weights.sum().detach(), where)
    return s / n


def average_grads(grads: list[torch.Tensor], where: str = "value_and_grad") -> list[torch.Tensor]:
    """Every worker's gradients averaged, in one all-reduce per dtype (flattened into one buffer)."""
    n = world()
    if n == 1:
        return grads
    out = list(grads)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for k, g in enumerate(grads):
        by_dtype.setdefault(g.dtype, []).append(k)
    for ks in by_dtype.values():
        flat = torch.cat([grads[k].reshape(-1) for k in ks])
        _all_reduce(flat, where)
        flat /= n
        for k, piece in zip(ks, flat.split([grads[k].numel() for k in ks])):
            out[k] = piece.view_as(grads[k])
    return out


OVERLAP_ENV = "SHAPESCRIPT_OVERLAP"
BUCKET_ENV = "SHAPESCRIPT_BUCKET_MB"
MIB = 1 << 20
# On unless SHAPESCRIPT_OVERLAP=off: a worker reads it when it starts (A/B runs, and a way back).
overlap: bool = os.environ.get(OVERLAP_ENV, "on").strip().lower() not in ("off", "0", "no", "false")


def _bucket_bytes(text: str) -> int:
    try:
        return int(float(text) * MIB)
    except ValueError:
        warnings.warn(f"{BUCKET_ENV}={text!r} is not a number of MB: the buckets take 25 MB", stacklevel=2)
        return 25 * MIB


# DDP's defaults: a small first bucket, so that the all-reduce starts early in the backward, then
# larger ones, so that there are few collectives. SHAPESCRIPT_BUCKET_MB is DDP's bucket_cap_mb.
BUCKET_BYTES = _bucket_bytes(os.environ.get(BUCKET_ENV, "25"))
FIRST_BUCKET_BYTES = min(MIB, BUCKET_BYTES)


def plan_buckets(params: list[torch.Tensor]) -> list[list[int]]:
    """The params' indices by bucket, in the order the buckets are sent. Gradients become ready
    about in reverse of the params' order (DDP's guess too), so the buckets fill that way, one dtype
    each, each closed once it holds its cap's bytes; within a bucket the indices ascend, so that a
    bucket of every param is `average_grads`' buffer, value for value."""
    filling: dict[torch.dtype, list[int]] = {}
    filled_bytes: dict[torch.dtype, int] = {}
    caps: dict[torch.dtype, int] = {}
    buckets: list[list[int]] = []
    for k in reversed(range(len(params))):
        p = params[k]
        filling.setdefault(p.dtype, []).append(k)
        filled_bytes[p.dtype] = filled_bytes.get(p.dtype, 0) + p.numel() * p.element_size()
        if filled_bytes[p.dtype] >= caps.get(p.dtype, FIRST_BUCKET_BYTES):
            buckets.append(sorted(filling.pop(p.dtype)))
            filled_bytes[p.dtype], caps[p.dtype] = 0, BUCKET_BYTES
    return buckets + [sorted(ks) for ks in filling.values()]


class BucketedAverage:
    """`average_grads` sent during the backward pass, as DDP does: while it is entered, a hook on each
    param takes its gradient as autograd makes it, and a bucket whose gradients are all in is
    flattened and its all-reduce started (async); `finish` sends what is left, waits and averages.
    Buckets start strictly in their order, so every worker starts the same collectives in the same
    order (with the backward's own, `all_sum`'s) whatever the timing; so a param that gets no
    gradient (its zeros are sent in `finish`) holds back its bucket and the ones after it."""

    def __init__(self, params: list[torch.Tensor], where: str) -> None:
        self.params, self.where = params, where
        self.buckets = plan_buckets(params)
        self.bucket_of = {k: b for b, ks in enumerate(self.buckets) for k in ks}
        self.arrived: list[dict[int, torch.Tensor]] = [{} for _ in self.buckets]
        self.sent: list[tuple[torch.Tensor, dist.Work]] = []  # by bucket, the first len(sent)
        self.hooks: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> BucketedAverage:
        self.hooks = [p.register_hook(partial(self._arrive, k)) for k, p in enumerate(self.params)]
        return self

    def __exit__(self, *exc: object) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def _arrive(self, k: int, grad: torch.Tensor) -> None:
        """A tensor hook: param k's whole gradient (a leaf's hook sees the sum of all its uses)."""
        self.arrived[self.bucket_of[k]][k] = grad
        self._send_ready()

    def _send_ready(self) -> None:
        while len(self.sent) < len(self.buckets):
            b = len(self.sent)
            if len(self.arrived[b]) < len(self.buckets[b]):
                return  # a later bucket ready first waits for this one
            flat = torch.cat([self.arrived[b][k].reshape(-1) for k in self.buckets[b]])
            self.arrived[b] = {}
            with collective(Op.ALL_REDUCE, flat.numel(), flat.dtype, self.where):
                self.sent.append((flat, dist.all_reduce(flat, async_op=True)))

    def finish(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every worker's `grads` (all of them, zeros for a param that got none) averaged: the buckets
        not yet sent go now, then each dtype's are waited for as one recorded collective."""
        for b in range(len(self.sent), len(self.buckets)):
            self.arrived[b] = {k: grads[k] for k in self.buckets[b]}
        self._send_ready()
        n = world()
        out = list(grads)
        by_dtype: dict[torch.dtype, list[int]] = {}
        for b, ks in enumerate(self.buckets):
            by_dtype.setdefault(grads[ks[0]].dtype, []).append(b)
        for dtype in dict.fromkeys(g.dtype for g in grads):  # average_grads' order
            bs = by_dtype[dtype]
            record(self.where, sum(self.sent[b][0].numel() for b in bs), dtype, "all-reduce")
            with collective(None, 0, dtype, self.where):
                for b in bs:
                    self.sent[b][1].wait()
            for b in bs:
                flat, ks = self.sent[b][0], self.buckets[b]
                flat /= n
                for k, piece in zip(ks, flat.split([grads[k].numel() for k in ks])):
                    out[k] = piece.view_as(grads[k])
        return out


def bucketed_average(params: list[torch.Tensor], where: str) -> BucketedAverage | None:
    """A BucketedAverage for a backward about to run, or None where `average_grads` does it: on one
    device, with SHAPESCRIPT_OVERLAP=off, or where the sums go through shared memory."""
    return BucketedAverage(params, where) if overlap and shm is None and world() > 1 else None


# batch_norm's constants, PyTorch's defaults: one device (runtime/ops.py) and several use these.
BATCH_NORM_MOMENTUM = 0.1
BATCH_NORM_EPS = 1e-5


def all_batch_norm(x: torch.Tensor, stats: object, mode: Mode, axis: int, where: str = "") -> torch.Tensor:
    """batch_norm with the batch's statistics from every worker: the sums and sums of squares per
    channel and the count, 2·C + 1 values in f64, in one all-reduce."""
    if not mode.training:  # Eval: the running statistics, nothing to share
        moved = x.movedim(axis, 1)
        out = F.batch_norm(moved, *running_statistics(stats), training=False, eps=BATCH_NORM_EPS)
        return out.movedim(1, axis)
    channels = x.shape[axis]
    flat = x.movedim(axis, -1).reshape(-1, channels).to(torch.float64)
    count = torch.tensor([float(flat.shape[0])], dtype=torch.float64, device=x.device)
    packed = all_sum(torch.cat([flat.sum(0), (flat * flat).sum(0), count]), where)
    total, squares, n = packed[:channels], packed[channels:-1], packed[-1]
    part = batch_part()
    if part is None or part[1] == 1:  # only a batch of one can give one value per channel: else no host sync
        check_statistics_count(int(n.item()), where)  # the whole count, so every worker raises together
    mean = total / n
    var = squares / n - mean * mean
    shape = [1] * x.dim()
    shape[axis] = channels
    out = (x - mean.to(x.dtype).view(shape)) / torch.sqrt(var.to(x.dtype).view(shape) + BATCH_NORM_EPS)
    with torch.no_grad():  # PyTorch's running statistics: the momentum, the unbiased variance
        running_mean, running_var = running_statistics(stats)
        keep = 1 - BATCH_NORM_MOMENTUM
        running_mean.mul_(keep).add_(BATCH_NORM_MOMENTUM * mean.to(running_mean.dtype))
        running_var.mul_(keep).add_(BATCH_NORM_MOMENTUM * (var * n / (n - 1)).to(running_var.dtype))
    return out
