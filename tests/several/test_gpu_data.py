"""How the workers' batches reach their devices (parallel/loading.py): on the CPU
as before, made where they are used; on a GPU, items copied from pinned memory on a stream of the
worker's own and a kept TensorDataset's next batch gathered ahead. The CPU tests check the choice,
that the CPU path pins nothing and makes no stream, and that every worker's parts are the batches
the controller's own loader makes (load_items, a direct gather); the GPU tests, skipped without a
GPU (their names hold `cuda`: scripts/gpu_check.sh picks them so), run the streams for real."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from programs import LINEAR
from sample_data import Rows, Sequences

import shapescript as ss
from shapescript.parallel import loading
from shapescript.parallel.loading import INLINE, STAGED, Transfer, WorkerLoop, keep, transfer_for
from shapescript.runtime.data import Batch, DataSpec, batch_fields, load_items, pad_batch, padded_sizes
from shapescript.runtime.loops import batches, shuffle

SEQUENCES = "dim V = 6\n\ndata Seq:\n    tokens: [n] Index[V]\n    targets: [n] Index[V]\n"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def ex_spec() -> DataSpec:
    return ss.load(LINEAR, devices="cpu", name="fit.ss").Ex


def seq_spec() -> DataSpec:
    return ss.load(SEQUENCES, devices="cpu", name="seq.ss").Seq


def tensors(n: int = 23) -> ss.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return ss.TensorDataset(x=torch.randn(n, 4, generator=g), y=torch.randint(0, 3, (n,), generator=g))


def worker(rank: int, world: int, device: str = "cpu") -> Any:
    return types.SimpleNamespace(rank=rank, world=world, device=torch.device(device))


def each_batch_from_the_workers(base: Any, spec: DataSpec, seeds: tuple[int, ...], n: int, world: int,
                                device: str = "cpu", transfer: Transfer | None = None) -> list[Batch]:
    """Every batch of the loop as the workers make it: each worker's part, padded to the whole
    batch's longest items as `loading.agree` pads them, joined on the CPU."""
    loops = []
    for rank in range(world):
        state = worker(rank, world, device)
        loops.append(WorkerLoop(state, keep(state, base, spec), seeds, n, spec, transfer))
    joined = []
    for number in range(loops[0].count):
        parts = [loop.take(number, *loop.my_share(number)) for loop in loops]
        longest: dict[str, int] = {}
        for part in parts:
            for name, size in padded_sizes(part).items():
                longest[name] = max(longest.get(name, 0), size)
        parts = [pad_batch(part, longest) for part in parts if part.size]
        joined.append(Batch(spec, {name: torch.cat([batch_fields(p)[name].cpu() for p in parts])
                                   for name in batch_fields(parts[0])},
                            {name: torch.cat([p.lengths[name].cpu() for p in parts]) for name in parts[0].lengths}))
    return joined


def the_controllers_batches(base: Any, spec: DataSpec, seeds: tuple[int, ...], n: int) -> list[Batch]:
    """The reference: the loop's batches as one device loads them, whole (load_items)."""
    view = base
    for seed in reversed(seeds):  # seeds are outermost first: the innermost shuffle wraps the base
        view = shuffle(view, seed)
    looped = batches(view, n, spec)
    assert looped.seeds == seeds
    return [Batch(spec, *load_items(base, indices, spec)) for indices in looped.indices()]


def assert_same_batches(got: list[Batch], expected: list[Batch]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert batch_fields(a).keys() == batch_fields(b).keys()
        for name in batch_fields(b):
            assert torch.equal(batch_fields(a)[name], batch_fields(b)[name]), name
            assert batch_fields(a)[name].dtype == batch_fields(b)[name].dtype
        assert a.lengths.keys() == b.lengths.keys()
        for name in b.lengths:
            assert torch.equal(a.lengths[name], b.lengths[name]), name


# -- the choice, and the CPU's unchanged path -------------------------------------------------------

def test_the_cpu_makes_batches_where_they_are_used_and_a_gpu_stages_them() -> None:
    assert transfer_for(torch.device("cpu")) == INLINE
    assert (INLINE.pin, INLINE.side_stream, INLINE.gather_ahead) == (False, False, 0)
    assert transfer_for(torch.device("cuda", 1)) == STAGED  # a device object: no GPU needed to choose
    assert (STAGED.pin, STAGED.side_stream, STAGED.gather_ahead) == (True, True, 1)
    state = worker(0, 1)
    assert WorkerLoop(state, tensors(), (), 8, ex_spec()).transfer == INLINE


@pytest.fixture
def no_cuda_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinning, streams and events raise: the CPU path must touch none of them."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the CPU path pinned memory or used a CUDA stream")
    monkeypatch.setattr(torch.Tensor, "pin_memory", refuse)
    for name in ("Stream", "Event", "current_stream", "stream", "device", "is_current_stream_capturing"):
        monkeypatch.setattr(torch.cuda, name, refuse)


@pytest.mark.parametrize("seeds", [(3, 9), ()])  # two shuffles, whose orders compose; none
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("kind", ["items", "kept", "ragged"])
def test_on_the_cpu_the_workers_parts_are_the_controllers_batches(no_cuda_calls: None, kind: str, world: int,
                                                                  seeds: tuple[int, ...]) -> None:
    base, spec = {"items": (Rows(21), ex_spec()), "kept": (tensors(), ex_spec()),
                  "ragged": (Sequences(19), seq_spec())}[kind]
    got = each_batch_from_the_workers(base, spec, seeds, 8, world)
    assert_same_batches(got, the_controllers_batches(base, spec, seeds, 8))
    if kind == "ragged":  # the parts were padded further, as the whole batch is
        assert any(len(set(b.lengths["n"].tolist())) > 1 for b in got)


def test_on_the_cpu_a_kept_dataset_is_gathered_at_call_time_and_items_load_ahead() -> None:
    spec, state = ex_spec(), worker(0, 1)
    kept = WorkerLoop(state, keep(state, tensors(), spec), (3,), 8, spec)
    kept.take(0, *kept.my_share(0))
    assert kept.ahead == {}  # on 2 cores a gather ahead would only compete with the step
    items = WorkerLoop(state, Rows(40), (3,), 8, spec)
    items.take(0, *items.my_share(0))
    assert set(items.ahead) == {1, 2}
    items.close()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_kept_datasets_rows_in_order_are_views_and_shuffled_ones_copies(world: int) -> None:
    spec, base = ex_spec(), tensors(50)
    for seeds in ((), (4,)):
        state = worker(world - 1, world)
        kept = keep(state, base, spec)
        loop = WorkerLoop(state, kept, seeds, 16, spec)
        part = loop.take(1, *loop.my_share(1))
        rows = [int(i) for i in loop.part(1, *loop.my_share(1))]  # a range, or a view of the order's tensor
        assert torch.equal(part.x, base.fields["x"][rows]) and torch.equal(part.y, base.fields["y"][rows])
        shares_memory = part.x.untyped_storage().data_ptr() == kept.fields["x"].untyped_storage().data_ptr()
        assert shares_memory == (not seeds), seeds  # in order: no copy of the rows


def test_a_kept_dataset_gathered_ahead_gives_the_same_batches_in_any_order_of_calls() -> None:
    """The GPU's gather ahead, run on the CPU (no streams): the same batches as a direct gather, a
    skipped batch's gather dropped, a batch taken twice made once."""
    spec, data = ex_spec(), tensors(41)
    ahead = Transfer(pin=False, side_stream=False, gather_ahead=1)
    state = worker(0, 2)  # the first of two: the last batch's one item is its
    loop = WorkerLoop(state, keep(state, data, spec), (5,), 8, spec, ahead)
    order = shuffle_indices(len(data), 5)

    def expected(number: int) -> torch.Tensor:
        start, size = loop.my_share(number)
        return data.fields["x"][order[number * 8 + start:number * 8 + start + size]]

    first = loop.take(0, *loop.my_share(0))
    assert torch.equal(first.x, expected(0))
    assert set(loop.ahead) == {1} and loop.ahead[1].done()
    assert loop.take(0, *loop.my_share(0)) is first
    third = loop.take(2, *loop.my_share(2))  # batch 1 skipped: its gather is dropped
    assert torch.equal(third.x, expected(2)) and set(loop.ahead) == {3}
    loop.take(3, *loop.my_share(3))
    last = loop.take(5, *loop.my_share(5))  # the last, smaller batch: nothing after it to gather
    assert torch.equal(last.x, expected(5)) and last.size == 1 and loop.ahead == {}
    other = loop.take(4, 0, 3)  # a part other than this worker's share: made now, not the gathered one
    assert torch.equal(other.x, data.fields["x"][order[32:35]])


def shuffle_indices(length: int, seed: int) -> list[int]:
    """The loop's order, drawn here as the loader's docs say: torch.randperm from a seeded generator."""
    return torch.randperm(length, generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_bad_item_loaded_ahead_raises_when_its_batch_is_taken() -> None:
    from sample_data import RowsBadAt
    spec, state = ex_spec(), worker(0, 1)
    loop = WorkerLoop(state, RowsBadAt(24, bad=12), (), 8, spec)
    loop.take(0, *loop.my_share(0))  # batch 1, holding item 12, loads in the thread
    with pytest.raises(ss.ShapeError, match="item 12"):
        loop.take(1, *loop.my_share(1))


# -- on a GPU ---------------------------------------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("kind", ["items", "kept", "ragged"])
def test_cuda_parts_copied_on_the_side_stream_are_the_controllers_batches(kind: str) -> None:
    base, spec = {"items": (Rows(21), ex_spec()), "kept": (tensors(), ex_spec()),
                  "ragged": (Sequences(19), seq_spec())}[kind]
    got = each_batch_from_the_workers(base, spec, (3, 9), 8, 2, "cuda:0")
    assert_same_batches(got, the_controllers_batches(base, spec, (3, 9), 8))
    assert loading._side_streams[torch.device("cuda:0")] != torch.cuda.current_stream(0)  # the worker's own


@needs_gpu
def test_cuda_batches_stay_intact_while_the_step_still_reads_them() -> None:
    """Slow steps queued on the step's stream while the next batches copy and gather on the side
    stream: each step must read its own batch, whatever memory the allocator hands the next copies."""
    spec, data = ex_spec(), tensors(4096)
    for base in (Rows(4096), data):
        state = worker(0, 1, "cuda:0")
        loop = WorkerLoop(state, keep(state, base, spec), (), 256, spec)
        sums = []
        for number in range(loop.count):
            batch = loop.take(number, *loop.my_share(number))
            torch.cuda._sleep(2_000_000)  # the step's stream is busy while later batches are made
            sums.append(batch.x.double().sum())
            del batch
            loop.last = None  # the loop's own reference: let the allocator reuse the batch's memory
        reference = [Batch(spec, *load_items(base, list(range(k * 256, (k + 1) * 256)), spec)).x.double().sum()
                     for k in range(loop.count)]
        torch.testing.assert_close(torch.stack(sums).cpu(), torch.stack(reference), rtol=0, atol=1e-9)


def train_losses(devices: str, data: Any) -> torch.Tensor:
    prog = ss.load(LINEAR, devices=devices, name="fit.ss")
    try:
        m = prog.Lin.init(seed=0)
        opt = ss.adamw(m, lr=0.1)
        sink = ss.sinks.memory()
        for _ in range(3):  # three epochs of 21 items: batches of 8, 8 and 5
            prog.fit(m, opt, data, sink)
        return torch.tensor([r["loss"] for r in sink.records])
    finally:
        prog.stop()


@needs_gpu
@pytest.mark.parametrize("devices", ["cuda[0]", pytest.param("cuda[0 1]", marks=needs_two_gpus)])
@pytest.mark.parametrize("kind", ["items", "kept"])
def test_cuda_loops_train_as_on_the_cpu(devices: str, kind: str) -> None:
    data = {"items": Rows(21), "kept": tensors(21)}[kind]
    on_cpu = train_losses("cpu", data)
    assert len(on_cpu) == 9
    torch.testing.assert_close(train_losses(devices, data), on_cpu, rtol=0, atol=1e-4)

