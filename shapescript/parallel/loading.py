"""Batches on several devices: the workers load them.

A loop over a dataset in the controller doesn't load its batches. The dataset is sent to every
worker once (again only if its length changes). A call names the loop (the dataset, the shuffles'
seeds, the batch size) and the batch's number; each worker makes the loop's order from the seeds
itself, and loads its own part of the next batches in a prefetch thread while the current step
runs; on a GPU they are copied from pinned memory on a stream of the worker's own (`Transfer`).
Items are checked as they load (a TensorDataset is kept on the worker's device, checked whole when
it arrives, and gathered there: on a GPU the next batch is gathered while the controller makes the
next call). A dataset the workers can't receive, as one defined
in the controller's main script, which they never import, is loaded in the controller with a
warning, and its batches travel through the pipes.
"""

from __future__ import annotations

import functools
import itertools
import pickle
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from shapescript.devices import shares
from shapescript.names import spec_var
from shapescript.runtime.data import (
    Batch,
    DataSpec,
    batch_fields,
    generic_dims,
    load_items,
    pad_batch,
    padded_sizes,
    trusted_batch,
)
from shapescript.runtime.loops import batch_bounds, shuffle_order, with_progress

_handles = itertools.count(1_000_000)  # apart from the models' handles


class RemoteBatch:
    """A batch that the workers load, each its own part. Reading a field in the controller loads
    the batch there (once). Every attribute of its own is in names.DATA_RESERVED or starts with `_`,
    out of the fields' way."""

    is_remote = True

    def __init__(self, plan: tuple, number: int, base: Any, size: int, items: Callable[[], list[int]],
                 spec: DataSpec) -> None:
        """`items()`: the batch's indices into `base`, asked for only if the controller loads it (the
        loop's order isn't drawn here otherwise: 0.7 ms a run for a dataset of 120,000)."""
        self._plan, self._number, self._base, self._items, self.spec = plan, number, base, items, spec
        self.size = size
        self._loaded: Batch | None = None

    def __getattr__(self, name: str) -> Any:
        spec = self.__dict__.get("spec")
        if spec is None or name.startswith("_") or name not in {f.name for f in spec.fields} | {"lengths"}:
            raise AttributeError(f"a batch of {spec.name if spec else 'a data type'} has no field `{name}`")
        if self._loaded is None:
            self._loaded = trusted_batch(spec, *load_items(self._base, self._items(), spec))
        return getattr(self._loaded, name)

    def _parts(self, sizes: list[int]) -> list[tuple]:
        """What each worker is sent: the loop, the batch's number, and where its part lies in it."""
        out, start = [], 0
        for n in sizes:
            out.append(("batchref", self._plan, self._number, start, n))
            start += n
        return out

    def _whole(self) -> tuple:
        """What every worker is sent for a call that takes the batch whole (unsplit, or split H):
        each loads all of it, from the dataset it already has (never the dataset itself)."""
        return ("batchref", self._plan, self._number, 0, self.size)

    def _own_shares(self) -> tuple:
        """What every worker is sent when each takes the share a call's split gives it (`my_share`):
        the same for all, so a call's message is pickled once."""
        return ("batchref", self._plan, self._number, None, None)

    def __repr__(self) -> str:
        return f"RemoteBatch[{self.size}] {self.spec.name} (loaded by the workers)"


@dataclass
class _Sent:
    dataset: Callable[[], Any]  # a weak reference to the dataset (or, if it takes none, a strong one)
    handle: int
    length: int
    pool: Any


class Datasets:
    """The datasets a program's workers hold, by the dataset object's identity. The controller
    holds each only weakly: when the user's last reference goes, the workers' copy is freed with
    the pool's next call."""

    def __init__(self) -> None:
        self.sent: dict[int, _Sent] = {}
        self.refused: set[int] = set()

    def handle(self, pool: Any, base: Any, spec: DataSpec) -> int | None:
        """The workers' handle of `base`, sending it first if need be; None if it can't be sent."""
        key = id(base)
        known = self.sent.get(key)
        if known is not None and known.dataset() is base and known.pool is pool:
            if known.length == len(base):
                return known.handle
            pool.release(known.handle)  # it grew or shrank since: the workers get it anew
        if key in self.refused:
            return None
        pickled, reason = _pickled(base)
        if pickled is None:
            self.refused.add(key)
            warnings.warn(f"the dataset {type(base).__name__} can't be sent to the workers ({reason}); the "
                          f"controller loads its batches and sends each worker its part, which costs a copy "
                          f"of every batch through the pipes", stacklevel=5)
            return None
        handle = next(_handles)
        pool.call("keep_dataset", (handle, pickled, spec.name), where=f"sending the dataset {type(base).__name__}")
        self.sent[key] = _Sent(self._reference(base, key, handle, pool), handle, len(base), pool)
        return handle

    def _reference(self, base: Any, key: int, handle: int, pool: Any) -> Callable[[], Any]:
        def gone(_: Any) -> None:  # the dataset was collected: forget it here and on the workers
            entry = self.sent.get(key)
            if entry is not None and entry.handle == handle:
                del self.sent[key]
            pool.release(handle)
        try:
            return weakref.ref(base, gone)
        except TypeError:  # a type without weak references: held as long as the program
            return lambda: base


class Pickled:
    """A dataset pickled once, in the controller: the call's message carries these bytes as they
    are, and unpickling the message on a worker makes the dataset again (`pickle.loads`), so that
    the dataset isn't pickled a second time to find out whether it can be sent."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple[Any, ...]:
        return pickle.loads, (self.data,)


def _pickled(base: Any) -> tuple[Pickled | None, str]:
    """`base` pickled as the workers' messages are (pickling.dumps), or None and why it can't be sent."""
    if type(base).__module__ == "__main__":
        return None, "it is defined in the main script, which the workers never import"
    from shapescript.parallel.pickling import dumps
    try:
        return Pickled(dumps(base)), ""
    except Exception as e:
        return None, f"it can't be pickled: {e}"


class RemoteBatches:
    """`data |> batches(n)` in the controller of a program on several devices."""

    def __init__(self, program: Any, batches: Any) -> None:
        self.program, self.batches = program, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        return with_progress(self._remote(), len(self), self.batches.spec.name)

    def _remote(self) -> Iterator[Any]:
        pool = self.program.workers()
        handle = self.program.datasets.handle(pool, self.batches.base, self.batches.spec)
        if handle is None:
            yield from self.batches.load()  # not through the hook again: __iter__ did that
            return
        b = self.batches
        plan = (next(_handles), handle, b.seeds, b.n, b.spec.name)  # all a worker needs to make the loop
        for number in range(len(b)):
            yield RemoteBatch(plan, number, b.base, b.size_of(number), functools.partial(b.items_of, number), b.spec)


def keep(state: Any, base: Any, spec: DataSpec) -> Any:
    """On a worker: a TensorDataset moves to the device, checked whole once; others stay as sent."""
    from shapescript.runtime.data import TensorDataset, check_batch
    if isinstance(base, TensorDataset):
        fields = check_batch(spec, base.fields, range(len(base)))
        base = TensorDataset(**{k: v.to(state.device) for k, v in fields.items()})
        base.checked = True  # `load_part` gathers from it without checking again
    return base


@dataclass(frozen=True)
class Transfer:
    """How a worker's batches reach its device, chosen by the device's kind (`transfer_for`)."""

    pin: bool  # loaded items go through pinned (page-locked) memory, which the GPU's DMA reads while it computes
    side_stream: bool  # copies and gathers run on a stream of the worker's own; the step's stream waits for them
    gather_ahead: int  # batches of a kept dataset gathered before their call


# On the CPU a batch is made where it is used: no pinning (there is no DMA to feed), no streams,
# and a kept dataset gathered at call time, since on 2 cores fetching ahead competes with the step.
INLINE = Transfer(pin=False, side_stream=False, gather_ahead=0)
# On a GPU, copies from pinned memory with non_blocking are asynchronous, and on a stream of their
# own they overlap the step's kernels (torch's "pin_memory and non_blocking" guide, torch.cuda.Stream).
# Gathering a kept dataset's next batch there as well takes it off the next call's path: the gather
# itself, and the upload of its indices, which from pageable memory would wait for the step's stream.
STAGED = Transfer(pin=True, side_stream=True, gather_ahead=1)


def transfer_for(device: torch.device) -> Transfer:
    return STAGED if device.type == "cuda" else INLINE


@dataclass
class Staged:
    """A batch made on the side stream: usable on another stream once that stream waits for `ready`."""

    batch: Batch
    ready: Any  # a torch.cuda.Event recorded after the batch's copies; None: made where it is used


_side_streams: dict[torch.device, Any] = {}  # each worker's own copy stream, by device
_side_lock = threading.Lock()  # the prefetch thread and the worker's main thread may both ask first


def side_stream(device: torch.device) -> Any:
    """The worker's own stream on `device` for copies and gathers, made on first use."""
    with _side_lock:
        stream = _side_streams.get(device)
        if stream is None:
            stream = _side_streams[device] = torch.cuda.Stream(device=device)
        return stream


def load_part(state: Any, base: Any, indices: Sequence[int] | torch.Tensor, spec: DataSpec,
              transfer: Transfer = INLINE, after: Any = None) -> Staged:
    """This worker's part of a batch, on its device. With a side stream, the copies (or the gather)
    are queued there and the result is `ready` once they're done: `use` makes the step's stream wait.
    `after`: a stream whose queued work the side stream waits for first (the step's, when the gather
    reads what it wrote), None when the source is host memory. `indices` may be a tensor of them
    (a shuffled loop's over a kept dataset), which then needn't be made from a list."""
    kept = getattr(base, "checked", False)  # kept on the device, checked whole: a gather, nothing more
    if kept and isinstance(indices, range) and indices.step == 1 and len(indices):
        # Rows in order (a loop without shuffle): views of the kept rows, no copy. The program never
        # writes into a batch, and a worker's result is pickled before the controller sees it.
        return Staged(trusted_batch(spec, {name: t[indices.start:indices.stop] for name, t in base.fields.items()}), None)
    if kept:  # gathered by a tensor of indices (as_tensor: a tensor as it is); items load one by one, by number
        rows = torch.as_tensor(indices, dtype=torch.long)
    else:
        items: list[int] = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
    if not transfer.side_stream:
        if kept:
            return Staged(trusted_batch(spec, base.__getitems__(rows)), None)
        fields, lengths = load_items(base, items, spec)
        return Staged(trusted_batch(spec, _moved(fields, state.device, transfer.pin),
                            _moved(lengths, state.device, transfer.pin)), None)
    if not kept:
        fields, lengths = load_items(base, items, spec)  # on the host, before the side stream is involved
    stream = side_stream(state.device)
    # The device too: a new thread's current CUDA device is 0, and pinning or copying there would
    # make a context on GPU 0 in every worker.
    with torch.cuda.device(state.device), torch.cuda.stream(stream):
        if after is not None:
            stream.wait_stream(after)
        if kept:
            batch = trusted_batch(spec, _gather(base.fields, rows, state.device))
        else:
            batch = trusted_batch(spec, _moved(fields, state.device, transfer.pin), _moved(lengths, state.device, transfer.pin))
        ready = stream.record_event()
    return Staged(batch, ready)


def _moved(tensors: dict[str, torch.Tensor], device: torch.device, pin: bool) -> dict[str, torch.Tensor]:
    return {k: _to_device(v, device, pin) for k, v in tensors.items()}


def _to_device(t: torch.Tensor, device: torch.device, pin: bool) -> torch.Tensor:
    # pin_memory's copy is the host's; torch's caching host allocator keeps the pinned block until the
    # asynchronous copy from it has run, so it may be dropped at once.
    return t.pin_memory().to(device, non_blocking=True) if pin else t.to(device)


def _gather(fields: dict[str, torch.Tensor], rows: torch.Tensor, device: torch.device) -> dict[str, torch.Tensor]:
    """TensorDataset.__getitems__ on the device, its indices there already (a view of the loop's order)
    or uploaded from pinned memory without waiting."""
    on_device = rows if rows.device.type != "cpu" else rows.pin_memory().to(device, non_blocking=True)
    return {name: t.index_select(0, on_device) for name, t in fields.items()}


def use(staged: Staged, device: torch.device) -> Batch:
    """The batch, safe to use on the current stream: that stream waits for the side stream's copies,
    and the caching allocator, which knows only the side stream the tensors were made on, is told
    that the current stream uses them too (Tensor.record_stream), so their memory isn't handed to
    the next copy while the step still reads it."""
    if staged.ready is None:
        return staged.batch
    current = torch.cuda.current_stream(device)
    if torch.cuda.is_current_stream_capturing():  # a wait on an event from outside a graph can't be captured
        staged.ready.synchronize()
    else:
        current.wait_event(staged.ready)
    for t in [*batch_fields(staged.batch).values(), *staged.batch.lengths.values()]:
        t.record_stream(current)
    return staged.batch


class WorkerLoop:
    """One loop over batches, on a worker: the order made from the seeds, and this worker's part of
    the next batches made ahead while the current step runs. A dataset loaded item by item loads the
    next `AHEAD` in a thread; a dataset kept on the device is gathered at call time on the CPU, and on
    a GPU the next one is gathered on the side stream as soon as the current one is queued, so it is
    ready while the controller makes the next call (`Transfer`)."""

    AHEAD = 2
    _threads = ThreadPoolExecutor(1, thread_name_prefix="shapescript-prefetch")  # one per worker process

    def __init__(self, state: Any, base: Any, seeds: tuple[int, ...], n: int, spec: DataSpec,
                 transfer: Transfer | None = None) -> None:
        self.state, self.base, self.n, self.spec = state, base, n, spec
        self.transfer = transfer if transfer is not None else transfer_for(state.device)
        self.total = len(base)
        self.kept = getattr(base, "checked", False)
        # A kept dataset is gathered with a tensor of indices: its part of the order is a view of one
        # (making it from a list of a batch of 6144's 3,072 took about 0.2 ms a step)
        order = shuffle_order(self.total, seeds) if seeds else None
        if order is not None and self.kept and self.transfer.side_stream:
            order = order.to(state.device)  # once a pass on the GPU: no indices pinned and uploaded each step
        self.order: Sequence[int] | torch.Tensor = (
            range(self.total) if order is None else order if self.kept else order.tolist())
        self.count = -(-self.total // n)
        self.ahead: dict[int, Future[Staged]] = {}
        self.whole = False  # the calls take each batch whole (an unsplit call, split H): so do the loads ahead
        self.last: tuple[tuple[int, int, int], Batch] | None = None  # a batch used twice loads once

    def part(self, number: int, start: int, size: int) -> Sequence[int] | torch.Tensor:
        """The rows of this worker's part: a range where the loop doesn't shuffle (load_part's views),
        a view of the order's tensor for a kept dataset, else a list (a slice of a list is a new list)."""
        first, _ = batch_bounds(self.total, self.n, number)
        return self.order[first + start:first + start + size]

    def my_share(self, number: int) -> tuple[int, int]:
        """Where this worker's part of batch `number` lies: the batch split as calls split it."""
        first, end = batch_bounds(self.total, self.n, number)
        sizes = shares(end - first, self.state.world)
        return sum(sizes[:self.state.rank]), sizes[self.state.rank]

    def next_share(self, number: int) -> tuple[int, int]:
        """What a load ahead of batch `number` takes: this worker's part, or the whole batch where
        the calls take it whole."""
        return (0, self.whole_size(number)) if self.whole else self.my_share(number)

    def whole_size(self, number: int) -> int:
        first, end = batch_bounds(self.total, self.n, number)
        return end - first

    def take(self, number: int, start: int | None, size: int | None) -> Batch:
        """This worker's part of batch `number` (start None: its own share), made ahead if it was the
        one expected; and start making the next ones."""
        if start is None or size is None:
            start, size = self.my_share(number)
        else:
            self.whole = (start, size) == (0, self.whole_size(number))
        if self.last is not None and self.last[0] == (number, start, size):
            return self.last[1]
        ahead = self.ahead.pop(number, None)
        for k in [k for k in self.ahead if k < number]:  # batches the loop skipped
            self.ahead.pop(k).cancel()
        if not self.kept:  # the thread loads the next ones while this one loads or waits
            self._start_ahead(number, self.AHEAD)
        if ahead is not None and (start, size) == self.next_share(number):
            staged = ahead.result()  # a bad item raises here, as it would have loading now
        else:
            staged = self._load(number, start, size)
        if self.kept:  # queued after this one's gather, on the same stream
            self._start_ahead(number, self.transfer.gather_ahead)
        batch = use(staged, self.state.device)
        self.last = ((number, start, size), batch)
        return batch

    def _start_ahead(self, number: int, count: int) -> None:
        # Items load in the thread; a gather is only queued on the GPU (or made on the CPU), so it runs here.
        start = _done if self.kept else self._threads.submit
        for k in range(number + 1, min(self.count, number + 1 + count)):
            if k not in self.ahead:
                self.ahead[k] = start(self._load, k, *self.next_share(k))

    def _load(self, number: int, start: int, size: int) -> Staged:
        # A gather reads the kept dataset on the side stream: it waits for what the step's stream has
        # queued, which orders it after anything written there (and after the last use of the memory
        # it may reuse). Copies from the host need no such wait; record_stream covers their memory.
        after = torch.cuda.current_stream(self.state.device) if self.kept and self.transfer.side_stream else None
        return load_part(self.state, self.base, self.part(number, start, size), self.spec, self.transfer, after)

    def close(self) -> None:
        for future in self.ahead.values():
            future.cancel()
        self.ahead.clear()


def _done(f: Callable[..., Staged], *args: Any) -> Future[Staged]:
    """f(*args) run now, as a finished Future (its exception kept for `result()` to raise)."""
    future: Future[Staged] = Future()
    try:
        future.set_result(f(*args))
    except Exception as e:
        future.set_exception(e)
    return future


class WorkerLoops:
    """A worker's loops, made when a call first names one; the oldest are dropped past `KEEP` (and
    made again, from their plan, if a batch of theirs comes back)."""

    KEEP = 4

    def __init__(self) -> None:
        self.loops: OrderedDict[int, WorkerLoop] = OrderedDict()

    def get(self, state: Any, plan: tuple) -> WorkerLoop:
        handle, dataset, seeds, n, spec = plan
        loop = self.loops.get(handle)
        if loop is None:
            loop = self.loops[handle] = WorkerLoop(state, state.objects[dataset], seeds, n,
                                                   state.program[spec_var(spec)])
            while len(self.loops) > self.KEEP:
                self.loops.popitem(last=False)[1].close()
        return loop


# A call's `part` when its split arguments are all batchrefs to each worker's own share: each worker
# works out where its part lies itself (program_handlers.call), so every worker gets the same message.
OWN_SHARE = "own share"


def needs_agreement(state: Any, plan: tuple) -> bool:
    """Whether loading a part of the loop's batches can fail, so the workers must agree that each
    has its part before any starts the step."""
    return not getattr(state.objects[plan[1]], "checked", False)


def agree(state: Any, plans: list[tuple], parts: list[Batch] | None) -> list[Batch] | None:
    """Every worker says whether it loaded its parts of the batches of `plans` (`parts` None: it
    couldn't) and how long the longest item of each part is along each generic dim, in one
    all-reduce (MAX). None when a worker failed; else each part padded to the whole batch's longest
    items, as the controller would pad the whole batch, so that every worker's values have the same
    sizes and results are one device's."""
    import torch.distributed as dist
    dims = [generic_dims(state.program[spec_var(plan[4])]) for plan in plans]
    values = [1 if parts is None else 0]
    for k, names in enumerate(dims):
        sizes = padded_sizes(parts[k]) if parts is not None else {}
        values += [sizes.get(name, 0) for name in names]
    agreed = torch.tensor(values, dtype=torch.int64, device=state.device)
    with state.waiting_at("loading the batch"):
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    longest = agreed.tolist()
    if longest[0] or parts is None:
        return None
    padded, at = [], 1
    for part, names in zip(parts, dims):
        padded.append(pad_batch(part, dict(zip(names, longest[at:at + len(names)]))))
        at += len(names)
    return padded
