"""Big batches from Python to the workers through shared memory, not through the pipes.

A call that splits a batch across the workers (remote.py's `split_value`) copies each big tensor
field once into a shared buffer of the controller's, and each worker is sent only a `SharedRows`:
the buffer's name, the byte offset of ITS rows, their dtype and shape. The worker maps the buffer
(kept mapped by name) and copies its rows out (`arrive`), into its own memory or onto its GPU, so
nothing the program keeps points into a buffer that the next call overwrites. Where the function
calls no extern fn (SharedRows.in_place, from Checked.reaches_extern) nothing can keep them, and a
worker on the CPU computes on its rows where they lie, read-only, without that copy. Small fields, and any
field when shared memory can't be had (no /dev/shm, full, or `enabled` False), go through the pipes.
Whether a call tries is its pool's to say (WorkerPool.shares_memory): processes of this machine map
the buffers; Ray actors on a cluster, perhaps on other hosts, never do, and other pools of this
process go on sharing while a cluster is connected.

Buffers are files in /dev/shm, mode 0600, named `shapescript-batch-<owner>-<random>` (owner_tag():
a controller killed before it could remove them is known to have ended, and the next controller to
share a batch sweeps them away). Why plain files and mmap rather than multiprocessing.shared_memory:
in Python 3.11 every SharedMemory, also one a process merely attaches to, is registered with that
process's resource_tracker, which unlinks it when the process exits (and warns of a "leak"): a
worker that exits would remove the controller's buffer under it. Plain files have no tracker; their
lifetime is ours: removed when a pool stops (`close_idle`), at the controller's exit, and swept.

A buffer belongs to one call from the moment its rows are written until every `SharedRows` of that
call is gone: they hold its `_Lease`, and a call's arguments live until its answers are in (in
RemoteFunction.__call__, and in the pool's call). A pool that pipelines calls must keep each call's
arguments until its answers are in, or the next call may overwrite rows a worker hasn't read yet.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import secrets
import threading
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from shapescript.parallel.handlers import handler
from shapescript.runtime.leftovers import owner_tag, preallocated_file, sweep

FOLDER = "/dev/shm"  # where the buffers live; a folder that isn't there means the pipes
ENV = "SHAPESCRIPT_SHARED_BATCHES"  # "0": every batch through the pipes, as before shared memory
THRESHOLD = 256 * 1024  # bytes of a tensor field from which it goes through shared memory (see benchmarks/shared_batches.py)
ALIGN = 64  # each field starts at a multiple of this in its buffer: any dtype can view it
MAX_BUFFERS = 4  # at most this many buffers at once (calls whose arguments are still held keep theirs)
WORKER_MAPS = 4  # buffers a worker keeps mapped
NAME = re.compile(r"shapescript-batch-(?P<pid>\d+)-(?P<start>\d+)-[0-9a-f]{16}")

enabled: bool = os.environ.get(ENV, "1").strip() != "0"  # for every pool; tests, benchmarks set it: the pipes


@dataclass(frozen=True)
class SharedRows:
    """One worker's rows of a tensor, as they travel: where they lie in a shared buffer. Pickled
    without its lease, which stays in the controller."""

    name: str
    offset: int  # in bytes, from the start of the buffer
    dtype: str  # "float32"
    shape: tuple[int, ...]
    # Nothing keeps the rows past the call (no extern fn sees them): the worker needn't copy them out
    in_place: bool = False
    lease: _Lease | None = field(default=None, compare=False, repr=False)

    def __reduce__(self) -> tuple[Any, ...]:
        return SharedRows, (self.name, self.offset, self.dtype, self.shape, self.in_place)


# -- the controller's side ---------------------------------------------------------------------------

class _Buffer:
    """A file in FOLDER, mapped for writing. `busy` while a call's lease holds it; `retired` once
    removed from the arena while busy, to be removed when the lease ends."""

    def __init__(self, size: int) -> None:
        self.name = f"shapescript-batch-{owner_tag()}-{secrets.token_hex(8)}"
        self.path = os.path.join(FOLDER, self.name)
        self.size = size
        self.owner = os.getpid()  # a forked child's exit must not remove its parent's buffers
        fd = preallocated_file(self.path, size)  # ENOSPC now rather than SIGBUS at a write
        try:
            self.map = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        self.bytes: torch.Tensor | None = torch.frombuffer(self.map, dtype=torch.uint8)
        self.busy = False
        self.retired = False

    def remove(self) -> None:
        """Unlink and unmap; safe to call twice, and from a finalizer. Workers that mapped it keep
        their mappings until they drop them."""
        if os.getpid() != self.owner:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.bytes = None
        try:
            self.map.close()
        except BufferError:  # a view of it is still alive: unmapped when that goes
            pass


class _Lease:
    """One call's hold on a buffer: the buffer is free again when the lease is collected."""

    def __init__(self, buffer: _Buffer) -> None:
        self.buffer = buffer
        weakref.finalize(self, _give_back, buffer)


def _give_back(buffer: _Buffer) -> None:
    # single stores, no lock: runs wherever the last SharedRows of a call goes
    buffer.busy = False
    if buffer.retired:
        buffer.remove()


class _Arena:
    """The controller's buffers, reused from call to call, one per call in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buffers: list[_Buffer] = []
        self.swept = False
        weakref.finalize(self, _remove_all, self.buffers)  # at the controller's exit

    def lease(self, size: int) -> _Lease | None:
        """A buffer of at least `size` bytes for one call; None if shared memory can't be had."""
        with self.lock:
            if not self.swept:  # a killed controller's buffers, once per process
                self.swept = True
                if os.path.isdir(FOLDER):
                    sweep(FOLDER, NAME, folders=False)
            idle = sorted((b for b in self.buffers if not b.busy), key=lambda b: b.size)
            chosen = next((b for b in idle if b.size >= size), None)
            if chosen is None:
                if idle:  # too small: grown, by replacing the biggest idle one
                    self._drop(idle[-1])
                elif len(self.buffers) >= MAX_BUFFERS:
                    return None
                try:
                    chosen = _Buffer(_rounded(size))
                except OSError:  # no FOLDER, full, not allowed: the pipes
                    return None
                self.buffers.append(chosen)
            chosen.busy = True
            return _Lease(chosen)

    def close_idle(self) -> None:
        """Remove every buffer; a busy one when its call's lease ends."""
        with self.lock:
            for buffer in list(self.buffers):
                self._drop(buffer)

    def _drop(self, buffer: _Buffer) -> None:
        self.buffers.remove(buffer)
        buffer.retired = True
        if not buffer.busy:
            buffer.remove()


def _remove_all(buffers: list[_Buffer]) -> None:
    for buffer in buffers:
        buffer.remove()


def _rounded(size: int) -> int:
    """Room to spare, so that batches of slowly growing sizes don't make a new buffer each."""
    return max(1 << 20, 1 << math.ceil(math.log2(size)))


_arena = _Arena()


def _forget_after_fork() -> None:
    """A forked child starts with no buffers: its parent's are its parent's to use and remove (and
    another thread may have held the arena's lock at the fork)."""
    global _arena
    _arena = _Arena()


os.register_at_fork(after_in_child=_forget_after_fork)


def close_idle() -> None:
    """Remove the controller's buffers (the pools call it as they stop): none is left in /dev/shm
    but one that a call still holds, removed as that call's arguments go."""
    _arena.close_idle()


def buffer_paths() -> list[str]:
    """The files of this process's buffers, for tests."""
    with _arena.lock:
        return [b.path for b in _arena.buffers]


def _sharable(t: torch.Tensor) -> bool:
    return (t.layout == torch.strided and not t.is_quantized and not t.is_nested and t.dim() >= 1
            and t.numel() * t.element_size() >= THRESHOLD)


def share_rows(fields: dict[str, torch.Tensor], parts: list[int], in_place: bool = False) -> dict[str, list[SharedRows]]:
    """For each big field (at least THRESHOLD bytes), split along its first axis into `parts` rows,
    each worker's rows in one shared buffer, written once; {} for the pipes (no big field, shared
    memory off or unavailable). The other fields aren't in the answer. `in_place`: the call keeps
    none of them (SharedRows.in_place)."""
    big = {k: t for k, t in fields.items() if _sharable(t)}
    if not enabled or not big:
        return {}
    offsets, end = {}, 0
    for k, t in big.items():
        offsets[k] = end
        end += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    lease = _arena.lease(end)
    if lease is None:
        return {}
    whole = lease.buffer.bytes
    assert whole is not None  # a busy buffer is never removed
    shared: dict[str, list[SharedRows]] = {}
    for k, t in big.items():
        nbytes = t.numel() * t.element_size()
        whole[offsets[k]:offsets[k] + nbytes].view(t.dtype).view(t.shape).copy_(t.detach())
        row_bytes, first = nbytes // t.shape[0], 0
        dtype = str(t.dtype).removeprefix("torch.")
        shared[k] = []
        for rows in parts:
            shared[k].append(SharedRows(lease.buffer.name, offsets[k] + first * row_bytes, dtype,
                                        (rows, *t.shape[1:]), in_place, lease))
            first += rows
    return shared


# -- the worker's side ---------------------------------------------------------------------------------

_maps: OrderedDict[str, torch.Tensor] = OrderedDict()  # buffer name -> its bytes, mapped read-only
reads = 0  # SharedRows this process has taken: evidence for tests that the rows came this way


def _mapped(name: str) -> torch.Tensor:
    if not NAME.fullmatch(name):  # only our own names make a path
        raise ValueError(f"not a shared batch buffer: {name!r}")
    if name in _maps:
        _maps.move_to_end(name)
        return _maps[name]
    fd = os.open(os.path.join(FOLDER, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        mapping = mmap.mmap(fd, os.fstat(fd).st_size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    with warnings.catch_warnings():  # read-only: it is only ever read, and copied from
        warnings.simplefilter("ignore", UserWarning)
        whole = torch.frombuffer(mapping, dtype=torch.uint8)
    _maps[name] = whole
    while len(_maps) > WORKER_MAPS:  # the oldest is unmapped once its tensor goes
        _maps.popitem(last=False)
    return whole


def arrive(value: torch.Tensor | SharedRows, device: torch.device) -> torch.Tensor:
    """A tensor field or argument on this worker's device: a SharedRows copied out of its buffer
    (its own memory: the buffer is the next call's) or, `in_place` on the CPU, a read-only view of
    its rows there, which the call lets go before it answers; a tensor moved as before."""
    global reads
    if not isinstance(value, SharedRows):
        return value.to(device)
    kind = getattr(torch, value.dtype)
    nbytes = math.prod(value.shape) * kind.itemsize
    rows = _mapped(value.name)[value.offset:value.offset + nbytes].view(kind).view(value.shape)
    reads += 1
    if device.type != "cpu":
        return rows.to(device)
    return rows if value.in_place else rows.clone()


@handler("shared_reads")
def shared_reads(state: Any) -> int:
    """How many SharedRows this worker has taken (`arrive`), to tell the pipes from shared memory."""
    return reads
