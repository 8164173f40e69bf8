"""All-reduces through shared memory, for workers that are processes of one machine on cpu[...].

Gloo sends every all-reduce through loopback TCP: on a 2-core machine an all-reduce of 2 floats
between two processes took 270-470 µs, and one of the README MLP's gradients (813,056 bytes) 1.8-2.6
ms (benchmarks/collectives.py). Processes of one machine can instead add up each other's values
where they lie: each worker copies its tensor into a slot of a buffer every worker has mapped, says
so with a counter, waits for the others' counters, and adds the slots up itself. That took about 23
µs and 80-100 µs on the same machine. It is the same sum (the slots are added in rank order, so
every worker gets the same bits), so what a program computes, and what the chapter and the
DeviceTable count, stay as they are: only the transport changes. Other collectives (all-gather,
reduce-scatter) and other reductions stay Gloo's.

The buffer (`create`, by the controller, while the workers start): a header of counters, each on a
cache line of its own, then two sets of one slot per worker, used by turns (collective number k uses
set k mod 2), so that a worker may start the next collective while another still reads the last one.
Worker r's `arrived` counter says it wrote collective k into its slot; its `done` counter that it
has read every slot of collective k. Before writing collective k, a worker waits until every worker
is done with k - 2, the last user of the same set. A tensor bigger than a slot goes through in
pieces, one collective each. Each counter is written by one worker only and only grows.

A worker that raises an error of its own in a call joins the call's remaining sums with zeros where
it knows them (runtime/ledger.py), up to the sum of the workers' failure flags before the update
(collectives.agree_to_update), at which every worker skips the step; where it doesn't know them
(the first call of its kind), it joins the next of the careful call's sums of flags. Either way it
then writes, in a third counter, the first collective it will never reach (`fail`); a peer waiting
for it there (a call where it couldn't join: a collective failed) raises StepSkipped rather than
wait until the collective timeout. After such a call the controller has every worker start again from the same counts
(`resync`, through Gloo).

Why this is safe as plain Python: the counters are 8-byte aligned stores and loads, and x86-64 keeps
stores in order (a worker that sees a counter sees the slot written before it). Other machines,
whose memory model does not promise that, use Gloo (`supported`). The file lives in /dev/shm, mode
0600, named after its controller (runtime/leftovers.py); the controller removes it as soon as every
worker has mapped it, and a controller killed before then leaves it for the next one to sweep. It is
allocated in full when made, so a full /dev/shm is found then (and Gloo used), never as a SIGBUS in
a worker.
"""

from __future__ import annotations

import mmap
import os
import platform
import re
import secrets
import time

import torch
import torch.distributed as dist

from shapescript.runtime.leftovers import owner_tag, preallocated_file, sweep
from shapescript.runtime.steps import StepSkipped

ENV = "SHAPESCRIPT_SHM_REDUCE"  # "off": all-reduces through Gloo (A/B runs, a way back); read as workers start
FOLDER = "/dev/shm"
NAME = re.compile(r"shapescript-reduce-(?P<pid>\d+)-(?P<start>\d+)-[0-9a-f]{16}")
LINE = 64  # bytes a counter has to itself: no two workers' counters share a cache line
MAX_WORKERS = 32
HEADER = 3 * MAX_WORKERS * LINE  # arrived, done and failed for each worker: 6 KiB
# Bytes of slots at most, whatever the number of workers. The file is unlinked once mapped, but its
# pages count against /dev/shm's size while the workers live (64 MiB in a default Docker container,
# shared with parallel/shared.py's batches): slots of 1 MiB hold the README MLP's gradients in one
# piece, and bigger tensors go in pieces at little cost.
BUDGET = 8 << 20
MAX_SLOT, MIN_SLOT = 1 << 20, 64 << 10
SPINS = 200  # looks at the counters before yielding the core
YIELD_S = 0.002  # then sched_yield for this long, then sleep, backing off up to MAX_SLEEP_S
MAX_SLEEP_S = 0.001
SUMMABLE = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)

def supported() -> bool:
    """Whether workers started now may use it: x86-64 (see the module's note), /dev/shm present, and
    not turned off."""
    return (os.environ.get(ENV, "on").strip().lower() not in ("off", "0", "no", "false")
            and platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir(FOLDER))


def slot_bytes(world: int) -> int:
    """Each slot's size: 1 MiB for up to 4 workers, less for more, so the buffer stays within BUDGET."""
    return max(MIN_SLOT, min(MAX_SLOT, BUDGET // (2 * world)) // LINE * LINE)


def create(world: int) -> str | None:
    """The controller's part: a buffer for `world` workers on this machine, allocated in full; its
    path, or None where there is none to be had (then the workers use Gloo)."""
    if not supported() or not 2 <= world <= MAX_WORKERS:
        return None
    sweep(FOLDER, NAME, folders=False)  # buffers of controllers killed while their workers started
    path = os.path.join(FOLDER, f"shapescript-reduce-{owner_tag()}-{secrets.token_hex(8)}")
    try:
        os.close(preallocated_file(path, HEADER + 2 * world * slot_bytes(world)))
    except OSError:  # /dev/shm full or limited: Gloo it is
        return None
    return path


def remove(path: str | None) -> None:
    """The controller's: remove the buffer's file (the workers' mappings stay valid)."""
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class SharedMemoryAllReduce:
    """A worker's side: `all_reduce(t)` sums `t` over the workers in place, like dist.all_reduce."""

    def __init__(self, path: str, rank: int, world: int, timeout: float) -> None:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        self.rank, self.world, self.timeout = rank, world, timeout
        self.slot = slot_bytes(world)
        if len(self._map) != HEADER + 2 * world * self.slot:
            raise ValueError(f"the shared all-reduce buffer {path} has {len(self._map)} bytes, not "
                             f"{HEADER + 2 * world * self.slot}")
        self._counters = memoryview(self._map)[:HEADER].cast("q")
        step = LINE // 8  # counters per line
        self._arrived = [2 * r * step for r in range(world)]
        self._done = [(2 * r + 1) * step for r in range(world)]
        # Worker r's first collective that it will never reach, having raised an error of its own (0: none)
        self._failed = [(2 * MAX_WORKERS + r) * step for r in range(world)]
        raw = torch.frombuffer(self._map, dtype=torch.uint8, offset=HEADER)
        self._slots = [[raw[(s * world + r) * self.slot:(s * world + r + 1) * self.slot] for r in range(world)]
                       for s in range(2)]
        self._count = 0  # collectives so far

    @staticmethod
    def can_sum(t: torch.Tensor) -> bool:
        """Whether `all_reduce` sums `t` (else the caller uses dist.all_reduce). Every worker asks it
        of the same shapes and dtypes (an all-reduce's own rule), so all of them take the same way."""
        return t.dtype in SUMMABLE and t.device.type == "cpu" and t.layout is torch.strided

    def all_reduce(self, t: torch.Tensor) -> bool:
        """Sum `t` over the workers, in place; False (nothing done) for a tensor this can't sum."""
        if not self.can_sum(t):
            return False
        flat = t.view(-1) if t.is_contiguous() else t.contiguous().view(-1)
        per = self.slot // t.element_size()
        for start in range(0, flat.numel(), per):
            self._reduce(flat[start:start + per])
        if not t.is_contiguous():
            t.copy_(flat.view(t.shape))
        return True

    def _reduce(self, part: torch.Tensor) -> None:
        self._count += 1
        k = self._count
        slots = self._slots[k % 2]
        size = part.numel() * part.element_size()
        if k > 2:
            self._wait(self._done, k - 2)  # every worker has read this set's slots of collective k - 2
        slots[self.rank][:size].view(part.dtype).copy_(part)
        self._counters[self._arrived[self.rank]] = k
        self._wait(self._arrived, k)
        views = [s[:size].view(part.dtype) for s in slots]
        torch.add(views[0], views[1], out=part)
        for v in views[2:]:
            part.add_(v)
        self._counters[self._done[self.rank]] = k

    def fail(self) -> None:
        """This worker raised an error of its own in a call (and joined none of the sums after it,
        or not all: runtime/ledger.py): it says which collective it will never reach (its counters stay as they are, for peers still reading the last one), and a peer
        waiting for it there, in that call or in a step sent after it, raises StepSkipped instead of
        waiting until the collective timeout, so that no worker updates a model in a step that
        failed on one. It stays so until `resync`."""
        self._counters[self._failed[self.rank]] = self._count + 1

    def resync(self) -> None:
        """After a call that failed on some worker, every worker at once (the controller's
        "resync_sums" call): they may have stopped at different sums, or marked their counters
        failed; all start again from the highest count, agreed through Gloo."""
        highest = torch.tensor([self._count], dtype=torch.int64)
        dist.all_reduce(highest, op=dist.ReduceOp.MAX)
        self._count = int(highest.item())
        self._counters[self._arrived[self.rank]] = self._count
        self._counters[self._done[self.rank]] = self._count
        self._counters[self._failed[self.rank]] = 0
        dist.barrier()  # no worker sums again before every worker's counters are set

    def _wait(self, counters: list[int], k: int) -> None:
        """Until every worker's counter has reached k: a few looks, then yielding the core, then
        sleeping a little longer each time; a DistBackendError after the collective timeout, as Gloo
        raises (the pool's report of where each worker was takes it for a collective's)."""
        values = self._counters
        looks = 0
        started = 0.0
        while True:
            if all(values[c] >= k for c in counters):
                return
            looks += 1
            if looks < SPINS:
                continue
            if any(values[c] < k and 0 < values[f] <= k for c, f in zip(counters, self._failed)):
                raise StepSkipped("another worker raised an error of its own in this call")
            now = time.monotonic()
            if not started:
                started = now
            waited = now - started
            if waited > self.timeout:
                raise dist.DistBackendError(
                    f"a shared-memory all-reduce waited {self.timeout:g} s (the collective timeout) for "
                    f"the other workers")
            if waited < YIELD_S:
                os.sched_yield()
            else:
                time.sleep(min(MAX_SLEEP_S, waited / 8))
