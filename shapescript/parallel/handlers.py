"""What the workers can run: a registry of named handlers.

A handler is a function `(state, *args) -> result`, registered under a name with `@handler(name)`;
the controller runs it on every worker with `WorkerPool.call(name, args, where)`. `state` is the
worker's `WorkerState` (rank, world, device, `objects` for handles kept between calls, and the status
helpers). The arguments and the result travel pickled; tensors are best returned on the CPU.

Rules for handlers:
- Register at import time, in this module or in a module the pool imports at start
  (`WorkerPool(..., modules=[...])`), so that no handler is imported lazily on a call.
- Wrap each collective in `with state.waiting_at(".ss location"):` so that a worker stuck there can
  be reported ("was waiting for the other workers at train.ss:30:12"); the worker itself marks the
  worker running `where` for the whole call, and idle after it.
- Raise ShapeScriptError subclasses (ShapeError, DomainError...) for the user's mistakes: the
  controller raises the same class, with this worker's traceback as a note. Anything else raises a
  WorkerError there.

The generic handlers below are the process layer's own, used by its tests and benchmarks.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from shapescript.errors import ShapeError
from shapescript.runtime import collectives

if TYPE_CHECKING:
    from shapescript.parallel.worker import WorkerState

Handler = Callable[..., Any]
HANDLERS: dict[str, Handler] = {}


def handler(name: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler `name`."""
    def register(fn: Handler) -> Handler:
        if name in HANDLERS and HANDLERS[name] is not fn:
            raise ValueError(f"two handlers are named {name!r}: {HANDLERS[name].__module__} and {fn.__module__}")
        HANDLERS[name] = fn
        return fn
    return register


@handler("resync_sums")
def resync_sums(state: WorkerState) -> None:
    """After a call that failed on some worker: the sums through shared memory start again from
    counters every worker agrees on (runtime/shm_reduce.py)."""
    if collectives.shm is not None:
        collectives.shm.resync()


@handler("ping")
def ping(state: WorkerState) -> dict[str, Any]:
    return {"rank": state.rank, "world": state.world, "pid": os.getpid(), "device": str(state.device)}


@handler("all_reduce_sum")
def all_reduce_sum(state: WorkerState, tensor: torch.Tensor, where: str = "all_reduce_sum") -> torch.Tensor:
    """The sum of every worker's `tensor`, computed on the workers' devices."""
    total = tensor.to(state.device, copy=True)
    with state.waiting_at(where):
        dist.all_reduce(total)
    return total.cpu()


@handler("sleep")
def sleep(state: WorkerState, seconds: float) -> int:
    time.sleep(seconds)
    return state.rank


@handler("raise")
def raise_shape_error(state: WorkerState, message: str, ranks: tuple[int, ...] | None = None) -> None:
    """Raise ShapeError(message) on the workers in `ranks` (all if None)."""
    if ranks is None or state.rank in ranks:
        raise ShapeError(message)


@handler("hang_before_collective")
def hang_before_collective(state: WorkerState, stuck_rank: int, where: str) -> None:
    """Worker `stuck_rank` never reaches the collective at `where`; the others wait there until the
    collective timeout, as when one worker is stuck in a loop or a deadlock."""
    if state.rank == stuck_rank:
        while True:
            time.sleep(3600)
    with state.waiting_at(where):
        dist.all_reduce(torch.zeros(1, device=state.device))


@handler("listening_sockets")
def listening(state: WorkerState) -> list[tuple[str, int]]:
    return listening_sockets(os.getpid())


def _address(hex_addr: str) -> tuple[str, int]:
    """An address of /proc/net/tcp{,6}: the IP as 32-bit words in host order, then the port."""
    ip_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(ip_hex)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw), int(port_hex, 16)


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on (Linux; [] elsewhere)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return []
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                found.append(_address(cols[1]))
    return found
