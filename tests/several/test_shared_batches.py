"""Big batches from Python reach the workers through shared memory (parallel/shared.py): the same
training as one device, the rows not pickled through the pipes, the pipes when shared memory is off
or can't be had, and no buffer left in /dev/shm once the workers stop, also after a worker dies."""

from __future__ import annotations

import errno
import gc
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import shapescript as ss
from shapescript.errors import WorkerError
from shapescript.parallel import shared

MLP = Path(__file__).resolve().parents[2] / "examples" / "readme" / "mlp.ss"
ODD = 1001  # 3 MiB of images: ragged shares on 2 workers (501, 500) and on 3 (334, 334, 333)
STEPS = 3
SHM = shared.FOLDER  # the workers' folder, whatever a test makes the controller's


def batches(n: int = ODD) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(n)
    return [{"img": torch.rand(n, 784, generator=g), "label": torch.randint(0, 10, (n,), generator=g)}
            for _ in range(STEPS)]


def train(prog: ss.Program, data: list[dict[str, torch.Tensor]]) -> tuple[list[float], dict[str, torch.Tensor]]:
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    losses = [float(prog.train_step(m, opt, batch)) for batch in data]
    return losses, {k: v.detach().clone() for k, v in m.state_dict().items()}


@pytest.fixture(scope="module")
def one_device() -> tuple[list[float], dict[str, torch.Tensor]]:
    return train(ss.load(MLP, devices="cpu"), batches())


def ours_in_shm() -> list[str]:
    """This process's buffers in /dev/shm, as their names say (owner_tag: pid first)."""
    return [n for n in os.listdir(SHM)
            if (found := shared.NAME.fullmatch(n)) and int(found["pid"]) == os.getpid()]


def reads(prog: ss.Program) -> list[int]:
    return prog.workers().call("shared_reads", ())


class Sent:
    """The biggest message the pool sends its workers, by wrapping its `_send`."""

    def __init__(self, prog: ss.Program) -> None:
        self.biggest = 0
        pool = prog.workers()
        send = pool._send

        def recording(payloads: list[bytes], where: str) -> Any:
            self.biggest = max([self.biggest, *map(len, payloads)])
            return send(payloads, where)
        pool._send = recording


def assert_same_training(got: tuple[list[float], dict[str, torch.Tensor]],
                         want: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    """Same losses to 1e-5; same weights to 1e-4, a tenth of one AdamW step (lr 1e-3): AdamW divides
    each gradient by its own running size, so a weight whose gradient is near zero turns float32
    rounding (the workers sum their rows' gradients in another order) into up to lr a step. A wrong
    share of rows moves the losses and most weights by far more (CI once saw 1.01e-5 on one weight
    of 200,704 with a bound of 1e-5)."""
    assert got[0] == pytest.approx(want[0], abs=1e-5)
    for k in want[1]:
        torch.testing.assert_close(got[1][k], want[1][k], atol=1e-4, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


# -- with workers --------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("devices, threshold", [("cpu[0 1]", shared.THRESHOLD), ("cpu[0 1 2]", 1024)],
                         ids=["images on 2", "images and labels on 3"])
def test_a_big_batch_from_python_trains_as_one_device_through_shared_memory(
        devices: str, threshold: int, one_device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "THRESHOLD", threshold)  # 1024: the Index labels (8 KiB) too
    prog = ss.load(MLP, devices=devices)
    try:
        before = reads(prog)
        sent = Sent(prog)
        got = train(prog, batches())
        fields = 2 if threshold == 1024 else 1
        assert [r - b for r, b in zip(reads(prog), before)] == [fields * STEPS] * prog.workers().world
        assert sent.biggest < 64 * 1024  # descriptors, not the 3 MiB of rows
        assert_same_training(got, one_device)
        assert ours_in_shm()  # kept for the next call
    finally:
        prog.stop()
    assert not ours_in_shm()


@pytest.mark.slow
def test_the_pipes_when_shared_memory_is_off_unavailable_or_full(
        one_device: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    prog = ss.load(MLP, devices="cpu[0 1]")
    try:
        shared_run = train(prog, batches())
        assert_same_training(shared_run, one_device)
        shared.close_idle()  # so that the next calls need a new buffer
        ways = {
            "off": lambda mp: mp.setattr(shared, "enabled", False),
            "no folder": lambda mp: mp.setattr(shared, "FOLDER", str(tmp_path / "missing")),
            "full": lambda mp: mp.setattr(os, "posix_fallocate", full),
        }
        for way, force in ways.items():
            with monkeypatch.context() as mp:
                force(mp)
                before, sent = reads(prog), Sent(prog)
                piped = train(prog, batches())
                assert reads(prog) == before, way  # no worker took rows from shared memory
                assert sent.biggest > ODD * 784 * 4 // 2, way  # a worker's rows, pickled
            assert piped[0] == shared_run[0], way  # the very same arithmetic, whichever way the rows came
            for k in shared_run[1]:
                assert torch.equal(piped[1][k], shared_run[1][k]), (way, k)
            assert not ours_in_shm(), way  # a failed buffer is removed at once
    finally:
        prog.stop()
    assert not ours_in_shm()


# A function that calls an extern fn may have its rows kept by Python code past the call: this one
# keeps each call's and answers the previous call's. Were the worker's rows a view of the buffer, the
# next call would have overwritten what it kept.
KEEPER = """\
devices cpu[0 1]
dim D = 1024
data Row:
    x: [D]
extern fn keep(x: [b D]) -> [b D] = "test_shared_batches.keep_and_give_back_the_last"
fn kept(rows: [b] Row) -> [b D] = keep(rows.x)
fn plain(rows: [b] Row) -> [b D] = rows.x * 2.0
fn same(rows: [b] Row) -> [b D] = rows.x
"""
_kept: list[torch.Tensor] = []


def keep_and_give_back_the_last(x: torch.Tensor) -> torch.Tensor:
    """The keeper's extern fn, on each worker: the rows of the call before (these, the first time)."""
    _kept.append(x)
    return _kept[-2] if len(_kept) > 1 else x


def test_rows_are_read_in_place_only_where_no_extern_fn_can_keep_them() -> None:
    prog = ss.load(KEEPER, name="keeper.ss")
    assert prog.checked.reaches_extern("kept") and not prog.checked.reaches_extern("plain")
    assert prog.namespace["plain"].plan.rows_in_place and not prog.namespace["kept"].plan.rows_in_place
    readme = ss.load(MLP, devices="cpu[0 1]")
    assert all(readme.namespace[f].plan.rows_in_place for f in ("forward", "loss", "train_step"))
    g = torch.Generator().manual_seed(1)
    first, second, third = (torch.rand(300, 1024, generator=g) for _ in range(3))  # 1.2 MB: shared memory
    try:
        before = reads(prog)
        assert torch.equal(prog.kept({"x": first}), first)
        assert torch.equal(prog.plain({"x": third}), third * 2.0)  # in place, through the same buffer
        assert torch.equal(prog.kept({"x": second}), first)  # kept by the extern fn: a copy, not the buffer
        assert torch.equal(prog.plain({"x": second}), second * 2.0)
        assert torch.equal(prog.kept({"x": third}), second)
        # its rows themselves as the result: sent before the call ends, so before the buffer is reused
        assert torch.equal(prog.same({"x": first}), first) and torch.equal(prog.same({"x": third}), third)
        assert [r - b for r, b in zip(reads(prog), before)] == [7] * 2  # every call's rows came that way
    finally:
        prog.stop()
    assert not ours_in_shm()


def test_an_extern_fn_called_deep_down_counts() -> None:
    src = KEEPER + ("fn middle(rows: [b] Row) -> [b D] = kept(rows) + 1.0\n"
                    "fn top(rows: [b] Row) -> [b D] = middle(rows) * 2.0\n")
    checked = ss.load(src, devices="cpu", name="keeper.ss").checked
    assert checked.reaches_extern("top") and checked.reaches_extern("middle")
    assert not checked.reaches_extern("plain")


def full(fd: int, offset: int, size: int) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.slow
def test_a_worker_killed_mid_run_leaves_no_buffer(one_device: Any) -> None:
    prog = ss.load(MLP, devices="cpu[0 1]")
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        data = batches()
        prog.train_step(m, opt, data[0])
        assert ours_in_shm()
        os.kill(prog.workers().pids[1], signal.SIGKILL)
        with pytest.raises(WorkerError, match="worker 1"):
            prog.train_step(m, opt, data[1])  # its rows already written to the buffer when the death is seen
        gc.collect()  # the error's traceback, which held the call's arguments, is gone
    finally:
        prog.stop()
    assert not ours_in_shm()


# -- the buffers themselves, in this process (FOLDER: tmp_path) -------------------------------------------

@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(shared, "FOLDER", str(tmp_path))
    monkeypatch.setattr(shared, "_arena", shared._Arena())
    monkeypatch.setattr(shared, "_maps", type(shared._maps)())
    return tmp_path


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16])
def test_each_worker_gets_its_rows_as_torch_split_cuts_them(folder: Path, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(1001, 300, generator=g) * 50).to(dtype)
    other = torch.randn(1001, 3, 2, generator=g).transpose(1, 2)  # not contiguous, and big enough below
    parts = [334, 334, 333]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shared, "THRESHOLD", 16)
        rows = shared.share_rows({"t": t, "other": other}, parts)
    for name, whole in (("t", t), ("other", other)):
        got = [shared.arrive(r, torch.device("cpu")) for r in rows[name]]
        for mine, want in zip(got, torch.split(whole, parts)):
            assert mine.dtype == want.dtype and torch.equal(mine, want)
            mine.zero_()  # a copy of its own: the buffer (and so the next read) is untouched
        assert torch.equal(shared.arrive(rows[name][0], torch.device("cpu")), torch.split(whole, parts)[0])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shared, "THRESHOLD", 16)
        in_place = shared.share_rows({"t": t}, parts, in_place=True)
    whole = shared._mapped(in_place["t"][0].name)
    for r, want in zip(in_place["t"], torch.split(t, parts)):
        mine = shared.arrive(r, torch.device("cpu"))
        assert torch.equal(mine, want)
        assert mine.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()  # no copy of its own


def test_a_small_field_stays_in_the_pipes_and_off_means_off(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = torch.zeros(shared.THRESHOLD // 4 - 1)
    big = torch.zeros(shared.THRESHOLD // 4)
    parts = [big.numel() // 2] * 2
    assert set(shared.share_rows({"small": small, "big": big}, parts)) == {"big"}
    monkeypatch.setattr(shared, "enabled", False)
    assert shared.share_rows({"big": big}, parts) == {}


def test_a_buffer_is_one_calls_until_its_rows_are_let_go(folder: Path) -> None:
    t = torch.arange(shared.THRESHOLD, dtype=torch.float32).reshape(-1, 8)
    parts = [t.shape[0] // 2] * 2
    first = shared.share_rows({"t": t}, parts)
    second = shared.share_rows({"t": t + 1}, parts)  # the first call's rows still held: another buffer
    assert first["t"][0].name != second["t"][0].name and len(files(folder)) == 2
    assert torch.equal(shared.arrive(first["t"][1], torch.device("cpu")), torch.split(t, parts)[1])
    name = first["t"][0].name
    del first
    again = shared.share_rows({"t": t + 2}, parts)
    assert again["t"][0].name == name  # reused once let go
    bigger = torch.zeros(4 * t.shape[0], 8)
    del second
    grown = shared.share_rows({"t": bigger}, [bigger.shape[0]])
    held_now = sorted([again["t"][0].name, grown["t"][0].name])
    assert files(folder) == held_now  # grown by replacing the idle one
    shared.close_idle()
    assert files(folder) == held_now  # both still held by their calls
    del again, grown  # removed as their calls let go, since the arena closed
    assert files(folder) == []


def test_at_most_max_buffers_then_the_pipes(folder: Path) -> None:
    t = torch.zeros(shared.THRESHOLD // 4)
    held = [shared.share_rows({"t": t}, [t.numel()]) for _ in range(shared.MAX_BUFFERS)]
    assert all(held) and shared.share_rows({"t": t}, [t.numel()]) == {}
    held.pop()
    assert shared.share_rows({"t": t}, [t.numel()])


def test_a_killed_controllers_buffers_are_swept_and_names_are_checked(folder: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "from shapescript.runtime.leftovers import owner_tag; "
                           "print(owner_tag())"], capture_output=True, text=True, check=True).stdout.strip()
    stale = folder / f"shapescript-batch-{gone}-{'0' * 16}"
    stale.write_bytes(b"x")
    unrelated = folder / "shapescript-batch-notes.txt"
    unrelated.write_bytes(b"x")
    t = torch.zeros(shared.THRESHOLD // 4)
    rows = shared.share_rows({"t": t}, [t.numel()])
    assert not stale.exists() and unrelated.exists() and len(files(folder)) == 2
    assert (os.stat(folder / rows["t"][0].name).st_mode & 0o777) == 0o600
    with pytest.raises(ValueError, match="not a shared batch buffer"):
        shared.arrive(shared.SharedRows("../../etc/passwd", 0, "uint8", (1,)), torch.device("cpu"))


def test_a_full_folder_removes_the_half_made_buffer(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "posix_fallocate", full)
    t = torch.zeros(shared.THRESHOLD // 4)
    assert shared.share_rows({"t": t}, [t.numel()]) == {} and files(folder) == []


def test_a_forked_child_neither_takes_nor_removes_its_parents_buffers(folder: Path) -> None:
    t = torch.zeros(shared.THRESHOLD // 4)
    rows = shared.share_rows({"t": t}, [t.numel()])
    name = rows["t"][0].name
    del rows  # idle now: the parent's next call would take it, never a child's
    pid = os.fork()
    if pid == 0:
        code = 3
        try:  # the arena alone: torch's thread pools may not survive a fork
            lease = shared._arena.lease(1024)
            code = 0 if lease is not None and lease.buffer.name != name else 1
            del lease
            shared.close_idle()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert files(folder) == [name]
