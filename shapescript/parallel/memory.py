"""What each worker's memory holds, measured on the worker: whatever the layout
(a copy of the params on every device, or a shard of them), the figures are what the device holds,
not what the checker expects it to hold.

The worker measures every call of a handler in `MEASURED_HANDLERS` (those that run the program's
code; a training step is one `call` of `train_step`): the memory resident when it began and the most
held during it.

- cpu: the process's resident memory (RSS). Writing "5" to /proc/self/clear_refs resets the peak
  (VmHWM in /proc/self/status) to the RSS now, so VmHWM after the call is the call's own peak.
  Where that can't be written (not Linux), the peak is ru_maxrss, the process's peak since it
  started, and `how` says so.
- cuda: torch's caching allocator: `memory_allocated` before, `reset_peak_memory_stats`, and
  `max_memory_allocated` after. Tensors only: the CUDA context and the allocator's cache are not in
  it. No synchronization is added: the allocator counts on the host.

The "memory" handler answers a `WorkerMemory`: those figures for the last call and the largest so
far, the memory now, and what the objects held by handle take (params, optimizer state). Gradients
are not held between calls: `value_and_grad` makes them inside a step, where they count in its peak.
"""

from __future__ import annotations

import os
import resource
import sys
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from shapescript.parallel.handlers import handler
from shapescript.parallel.program_handlers import own_bytes
from shapescript.runtime.model import Model
from shapescript.runtime.optim import Optimizer

if TYPE_CHECKING:
    from shapescript.parallel.pool import WorkerPool
    from shapescript.parallel.worker import WorkerState

# The handlers that run the program's code; the others ("ping", "objects", "memory"...) must not
# reset the peaks that they would otherwise replace with their own.
MEASURED_HANDLERS = frozenset({"call"})

CPU_PEAK = "the peak RSS during the call (/proc/self/clear_refs, VmHWM)"
CPU_LIFETIME_PEAK = "the peak RSS since the worker started (ru_maxrss: this system can't reset it per call)"
CUDA_PEAK = "the peak of torch's cuda allocator during the call (tensors only)"

_STATUS_READ = 8192  # /proc/self/status is about 1.5 KB


@dataclass(frozen=True)
class CallPeak:
    """One call's memory on one worker, in bytes: resident when it began (cpu: RSS; cuda: allocated)
    and the most held during it."""

    what: str  # the call as the worker's status says it: "`train_step` (notebook.ss:12:5)"
    before: int
    peak: int

    @property
    def added(self) -> int:
        """What the call held on top of what was there: activations, gradients, temporaries."""
        return max(0, self.peak - self.before)


@dataclass(frozen=True)
class WorkerMemory:
    """A worker's memory as the "memory" handler answers it, in bytes."""

    rank: int
    device: str
    how: str  # how the peaks were measured: CPU_PEAK, CPU_LIFETIME_PEAK or CUDA_PEAK
    now: int  # cpu: RSS now; cuda: tensors allocated now
    params: int  # the params and buffers of every model held by handle
    optimizer_state: int  # every optimizer's state (AdamW: two tensors per param)
    last: CallPeak | None  # the last measured call; None before the first
    largest: CallPeak | None  # the measured call with the highest peak so far
    model_bytes: dict[str, int] = field(default_factory=dict)  # by model type: one model's bytes here
    gradients: int = 0  # none are held between calls (see the module's doc)

    @property
    def activations(self) -> int | None:
        """"Activations and the rest" of the last call: its peak over what was resident before."""
        return self.last.added if self.last is not None else None


class _ProcStatus:
    """This process's VmRSS and VmHWM: the peak from a /proc/self/status kept open (15-20 µs a read,
    which the worker pays after its reply has gone), the resident memory from /proc/self/statm
    (about 2 µs: the same count of pages, without the rest of the status to format)."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        self._statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        self._page = os.sysconf("SC_PAGE_SIZE")

    def read(self, key: bytes) -> int:
        raw = os.pread(self._fd, _STATUS_READ, 0)  # a /proc file is made afresh on each read at offset 0
        start = raw.index(key + b":") + len(key) + 1
        return int(raw[start:raw.index(b"kB", start)]) * 1024

    def resident(self) -> int:
        """VmRSS: statm's second field, resident pages (file, anonymous and shared ones, as VmRSS)."""
        return int(os.pread(self._statm, 128, 0).split()[1]) * self._page


class Meter:
    """One worker's measurements: `with meter.measuring(what): ...` around each measured call. With
    `later=True` the call's peak is read later, by `settle()` (a worker calls it once its reply has
    gone, off the round trip), or by whatever reads `last` or `largest`, or by the next `measuring`:
    whichever comes first (so the peak also counts the pickling of the reply)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._last: CallPeak | None = None
        self._largest: CallPeak | None = None
        self._unsettled: tuple[str, int] | None = None  # (what, before) of a call whose peak isn't read yet
        self._status: _ProcStatus | None = None
        self._clear_refs: int | None = None
        self.how = CUDA_PEAK
        if device.type != "cuda":
            self.how = CPU_LIFETIME_PEAK
            try:
                self._status = _ProcStatus()
                self._clear_refs = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
                self._reset_rss_peak()
                self.how = CPU_PEAK
            except (OSError, ValueError):
                self._clear_refs = None

    def _reset_rss_peak(self) -> None:
        assert self._clear_refs is not None
        os.write(self._clear_refs, b"5")  # 5: reset the peak resident set size to the current one

    def now(self) -> int:
        """Resident now: cpu RSS, or cuda tensors allocated."""
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device)
        if self._status is not None:
            return self._status.resident()
        return _lifetime_peak_rss()  # nothing better without /proc

    @property
    def last(self) -> CallPeak | None:
        """The last measured call; None before the first."""
        self.settle()
        return self._last

    @property
    def largest(self) -> CallPeak | None:
        """The measured call with the highest peak so far."""
        self.settle()
        return self._largest

    def measuring(self, what: str, later: bool = False) -> _Measuring:
        return _Measuring(self, what, later)

    def settle(self) -> None:
        """Read the peak of the call measured last, if not yet read."""
        if self._unsettled is not None:
            (what, before), self._unsettled = self._unsettled, None
            self._record(CallPeak(what, before, self._peak()))

    def _start(self) -> int:
        before = self.now()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._clear_refs is not None:
            self._reset_rss_peak()
        return before

    def _peak(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        if self._clear_refs is not None and self._status is not None:
            return self._status.read(b"VmHWM")
        return _lifetime_peak_rss()

    def _record(self, call: CallPeak) -> None:
        self._last = call
        if self._largest is None or call.peak >= self._largest.peak:
            self._largest = call


def _lifetime_peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


class _Measuring:
    """Meter.measuring's context. A class, not a generator: it runs around every call."""

    __slots__ = ("meter", "what", "later", "before")

    def __init__(self, meter: Meter, what: str, later: bool) -> None:
        self.meter, self.what, self.later, self.before = meter, what, later, 0

    def __enter__(self) -> None:
        self.meter.settle()
        self.before = self.meter._start()

    def __exit__(self, *exc: object) -> None:
        self.meter._unsettled = (self.what, self.before)
        if not self.later:
            self.meter.settle()


_UNMEASURED = nullcontext()


def measured(state: WorkerState, name: str) -> AbstractContextManager[None]:
    """Around the worker's running of handler `name`: measured if it runs the program's code. The
    status names the call: "`train_step` (f.ss:3:4)". The worker settles the peak after replying."""
    return state.meter.measuring(state.text, later=True) if name in MEASURED_HANDLERS else _UNMEASURED


@handler("memory")
def memory(state: WorkerState) -> WorkerMemory:
    """This worker's `WorkerMemory`."""
    meter = state.meter
    params = optimizer_state = 0
    model_bytes: dict[str, int] = {}
    for obj in state.objects.values():
        size = own_bytes(obj) or 0
        if isinstance(obj, Model):
            params += size
            model_bytes[obj.spec.name] = max(size, model_bytes.get(obj.spec.name, 0))
        elif isinstance(obj, Optimizer):
            optimizer_state += size
    return WorkerMemory(state.rank, str(state.device), meter.how, meter.now(), params, optimizer_state,
                        meter.last, meter.largest, model_bytes)


def ask(pool: WorkerPool, where: str) -> list[WorkerMemory]:
    """Every worker's memory, in rank order."""
    return pool.call("memory", (), where=where)
