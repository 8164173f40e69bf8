"""All-reduces through shared memory (runtime/shm_reduce.py) for workers of one machine on cpu[...].

References: the sum of every rank's tensor added in rank order in this process (the same bits the
workers must get), Gloo's all-reduce of the same values in the same processes, and a program trained
with Gloo instead (bitwise equal on two workers, whose sum a + b has one rounding either way).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from support import importable

import shapescript as ss
from shapescript.api import parse_devices
from shapescript.errors import WorkerError
from shapescript.parallel.pool import WorkerPool
from shapescript.runtime import shm_reduce

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "examples" / "readme" / "mlp.ss"

pytestmark = pytest.mark.skipif(not shm_reduce.supported(), reason="shared-memory all-reduces need x86-64 and /dev/shm")

# (name, shape, dtype) of each case; "big" is more than a slot, so it goes in pieces
CASES = [("pair", (2,), torch.float32), ("matrix_t", (5, 3), torch.float32), ("f64", (7,), torch.float64),
         ("bf16", (33,), torch.bfloat16), ("ints", (4,), torch.int64), ("empty", (0,), torch.float32),
         ("big", (shm_reduce.MAX_SLOT // 4 + 3,), torch.float32)]
REPEATS = 5  # each case this many times: the two sets of slots are used by turns

RANK_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import os, torch, torch.distributed as dist
from safetensors.torch import save_file
from shapescript.runtime.shm_reduce import SharedMemoryAllReduce
path, rank, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", store=dist.FileStore(path + ".store", world), rank=rank, world_size=world)
shm = SharedMemoryAllReduce(path, rank, world, timeout=60)
results = {{}}
for name, shape, dtype in {cases!r}:
    for i in range({repeats}):
        g = torch.Generator().manual_seed(1000 * rank + i)
        x = (torch.randn(shape, generator=g) * 100).to(getattr(torch, dtype))
        if name == "matrix_t":
            x = x.t()  # not contiguous: summed all the same, in place
        gloo = x.clone()
        assert shm.all_reduce(x)
        dist.all_reduce(gloo)
        results[f"{{name}}.{{i}}"], results[f"{{name}}.{{i}}.gloo"] = x.contiguous(), gloo.contiguous()
flags = torch.zeros(3, dtype=torch.bool)
results["bool_refused"] = torch.tensor([not shm.all_reduce(flags)])
save_file(results, out)
dist.destroy_process_group()
"""


def inputs(name: str, shape: tuple[int, ...], dtype: torch.dtype, rank: int, i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + i)
    x = (torch.randn(shape, generator=g) * 100).to(dtype)
    return x.t() if name == "matrix_t" else x


@pytest.mark.parametrize("world", [2, 3])
def test_every_worker_gets_the_sum_in_rank_order(world: int, tmp_path: Path) -> None:
    path = shm_reduce.create(world)
    assert path is not None
    try:
        script = RANK_SCRIPT.format(root=str(ROOT), repeats=REPEATS,
                                    cases=[(n, s, str(d).removeprefix("torch.")) for n, s, d in CASES])
        outs = [tmp_path / f"rank{r}.safetensors" for r in range(world)]
        procs = [subprocess.Popen([sys.executable, "-c", script, path, str(r), str(world), str(outs[r])])
                 for r in range(world)]
        assert [p.wait(timeout=120) for p in procs] == [0] * world
    finally:
        shm_reduce.remove(path)
    got = [load_file(str(o)) for o in outs]
    for name, shape, dtype in CASES:
        for i in range(REPEATS):
            parts = [inputs(name, shape, dtype, r, i) for r in range(world)]
            expected = parts[0] + parts[1]
            for part in parts[2:]:
                expected = expected + part
            for r in range(world):
                mine = got[r][f"{name}.{i}"]
                assert mine.dtype == dtype and mine.shape == expected.shape
                assert torch.equal(mine, expected), (name, i, r)
                # Gloo's own all-reduce of the same values: the same sum, to the bit on 2 workers;
                # on 3 its order of adding may round otherwise, within two roundings of the terms
                gloo = got[r][f"{name}.{i}.gloo"]
                if world == 2 or not dtype.is_floating_point:
                    assert torch.equal(mine, gloo), (name, i, r)
                else:
                    bound = 2 * torch.finfo(dtype).eps * sum(p.double().abs() for p in parts)
                    assert bool(((mine.double() - gloo.double()).abs() <= bound).all()), (name, i, r)
    assert all(bool(g["bool_refused"]) for g in got)  # what it can't sum is left to Gloo


def test_a_worker_left_waiting_raises_after_the_timeout() -> None:
    path = shm_reduce.create(2)
    assert path is not None
    try:
        shm = shm_reduce.SharedMemoryAllReduce(path, 0, 2, timeout=0.3)
    finally:
        shm_reduce.remove(path)
    t0 = time.monotonic()
    with pytest.raises(dist.DistBackendError, match="waited 0.3 s"):
        shm.all_reduce(torch.ones(2))  # worker 1 never comes
    assert 0.3 <= time.monotonic() - t0 < 5


def test_the_buffer_is_private_allocated_and_swept(monkeypatch: pytest.MonkeyPatch) -> None:
    # a buffer of a controller that ended (no process has that pid) is swept by the next create
    stale = Path(shm_reduce.FOLDER) / "shapescript-reduce-999999999-1-0123456789abcdef"
    stale.write_bytes(b"")
    path = shm_reduce.create(3)
    try:
        assert path is not None and not stale.exists()
        info = os.stat(path)
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_size == shm_reduce.HEADER + 2 * 3 * shm_reduce.slot_bytes(3)
        assert info.st_blocks * 512 >= info.st_size  # allocated now, not at a worker's first write
        assert shm_reduce.NAME.fullmatch(os.path.basename(path))
    finally:
        shm_reduce.remove(path)
    assert not os.path.exists(path)
    monkeypatch.setenv(shm_reduce.ENV, "off")
    assert shm_reduce.create(2) is None  # SHAPESCRIPT_SHM_REDUCE=off: Gloo


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with importable(tmp_path_factory.mktemp("shm_probe"), "ss_shm_probe", """
        from shapescript.parallel.handlers import handler
        from shapescript.runtime import collectives

        @handler("uses_shm")
        def uses_shm(state):
            return collectives.shm is not None

        @handler("shm_hang")
        def shm_hang(state, stuck_rank, where, out):
            # As handlers.py's hang_before_collective, through the compiled code's all-reduce: the
            # others wait for `stuck_rank` in shared memory, and write how much CPU time they spent
            # into the folder `out` (their answers are errors)
            import os, time, torch
            if state.rank == stuck_rank:
                while True:
                    time.sleep(3600)
            collectives.status_hook = state.waiting_at  # as loading a program sets it
            cpu = time.process_time()
            try:
                collectives._all_reduce(torch.zeros(1), where)
            finally:
                with open(os.path.join(out, f"cpu-{state.rank}"), "w") as f:
                    f.write(str(time.process_time() - cpu))
    """) as folder:
        yield folder


def ours_in_dev_shm() -> list[str]:
    return [n for n in os.listdir(shm_reduce.FOLDER)
            if (found := shm_reduce.NAME.fullmatch(n)) and int(found["pid"]) == os.getpid()]


@pytest.mark.parametrize("enabled", [True, False])
def test_a_pool_of_this_machine_uses_it_and_leaves_no_file(enabled: bool, probe_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(shm_reduce.ENV, "on" if enabled else "off")
    with WorkerPool(parse_devices("cpu[0 1]"), modules=["ss_shm_probe"]) as pool:
        pool.start()
        assert ours_in_dev_shm() == []  # removed once every worker had mapped it
        assert pool.call("uses_shm", ()) == [enabled, enabled]


def trained(devices: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    prog = ss.load(README, devices=devices)
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        g = torch.Generator().manual_seed(0)
        losses = []
        for rows in (64, 37, 64):  # 37: an uneven split
            batch = {"img": torch.rand(rows, 784, generator=g), "label": torch.randint(0, 10, (rows,), generator=g)}
            losses.append(float(prog.train_step(m, opt, batch)))
        return losses, {"w1": m.w1, "w2": m.w2}
    finally:
        prog.stop()


def test_training_on_two_workers_is_as_with_gloo_to_the_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = trained("cpu[0 1]")
    monkeypatch.setenv(shm_reduce.ENV, "off")
    gloo = trained("cpu[0 1]")
    assert ours[0] == gloo[0]
    for name in ("w1", "w2"):
        assert torch.equal(ours[1][name], gloo[1][name])
    one = trained("cpu")  # and the guarantee: what one device computes
    torch.testing.assert_close(torch.tensor(ours[0]), torch.tensor(one[0]), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_worker_left_waiting_in_a_program_is_reported_where_it_waited(probe_dir: Path, tmp_path: Path) -> None:
    """The chapter's report of a step that didn't finish, as with Gloo (tests/parallel/test_pool.py),
    for a wait in shared memory; the waiting worker sleeps rather than spin through the timeout."""
    pool = WorkerPool(parse_devices("cpu[0 1 2]"), timeout=2,
                      modules=["shapescript.parallel.program_handlers", "ss_shm_probe"])
    with pool:
        pool.start()
        assert pool.call("uses_shm", ()) == [True] * 3
        with pytest.raises(WorkerError) as info:
            pool.call("shm_hang", (1, "train.ss:30:12", str(tmp_path)), where="`train_step` (train.ss:32:4)")
    assert str(info.value) == (
        "a worker failed while running `train_step` (train.ss:32:4), and worker 1 didn't finish:\n"
        "  worker 0: was waiting for the other workers at train.ss:30:12\n"
        "  worker 1: didn't answer; it was running `train_step` (train.ss:32:4)\n"
        "  worker 2: was waiting for the other workers at train.ss:30:12")
    assert "waited 2 s (the collective timeout)" in info.value.__notes__[1]  # in worker 0's traceback
    spent = [float((tmp_path / f"cpu-{rank}").read_text()) for rank in (0, 2)]
    assert len(spent) == 2 and max(spent) < 0.5, spent  # of the 2 s each waited
