"""The process layer on cpu[...]: workers, calls, errors from handlers, and every way a call can fail.

Starting workers costs seconds, so pools are shared: `pool2` and `pool3` for the tests that leave
their pool working, and `spares` for the tests that break one, where the new pool that shows a
program can go on after the failure is the next test's pool to break.
"""

from __future__ import annotations

import os
import pickle
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from support import fork_server_pids, importable

from shapescript.api import parse_devices
from shapescript.errors import ShapeError, WorkerError
from shapescript.parallel import pool as pool_mod
from shapescript.parallel import worker as worker_mod
from shapescript.parallel.handlers import listening_sockets
from shapescript.parallel.pool import STOP_GRACE, WorkerPool, collective_timeout, current_collective_timeout

ROOT = Path(__file__).resolve().parents[2]
WHERE = "`train_step` (train.ss:32:4)"
live: set[WorkerPool] = set()  # the shared pools: their workers are the children a test may leave


def started(devices: str, **kw: object) -> WorkerPool:
    pool = WorkerPool(parse_devices(devices), **kw)  # type: ignore[arg-type]
    pool.start()
    return pool


def children() -> set[int]:
    """Processes whose parent is this one, zombies included."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(text.rsplit(")", 1)[1].split()[1]) == os.getpid():
                found.add(int(entry))
    return found


def assert_no_workers_left(pids: list[int], seconds: float = 10.0) -> None:
    """The workers are gone within `seconds`: a worker forked by the fork server is reaped by that
    server, which may be busy a moment (its idle preload of torch._dynamo, on a loaded machine), so
    its process may show as a zombie for that long after the pool gave up waiting for it."""
    deadline = time.monotonic() + seconds
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        assert time.monotonic() < deadline, [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        time.sleep(0.05)
    assert pids
    assert children() <= {pid for pool in live for pid in pool.pids} | fork_server_pids()


def ping_ok(pool: WorkerPool) -> None:
    answers = pool.call("ping", ())
    assert [a["rank"] for a in answers] == list(range(pool.world))
    assert len({a["pid"] for a in answers} | {os.getpid()}) == pool.world + 1


@pytest.fixture(scope="module")
def pool2() -> Iterator[WorkerPool]:
    pool = started("cpu[0 1]")
    live.add(pool)
    yield pool
    live.discard(pool)
    pool.stop()


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A module only the controller's sys.path finds, registering a handler of its own."""
    with importable(tmp_path_factory.mktemp("probe"), "ss_probe_handlers", """
        import torch
        from shapescript.parallel.handlers import handler

        @handler("probe")
        def probe(state):
            return __file__

        @handler("fail_after_collective")
        def fail_after_collective(state):
            state.waiting_at("train.ss:30:12")  # as a hook that never restores the status
            torch.distributed.all_reduce(torch.ones(1))
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    """) as folder:
        yield folder


@pytest.fixture(scope="module")
def pool3(probe_dir: Path) -> Iterator[WorkerPool]:
    """Started in the background, with a 3 s collective timeout and a module from sys.path."""
    collective_timeout(3)
    try:
        pool = WorkerPool(parse_devices("cpu[0 1 2]"), modules=["ss_probe_handlers"])
        t0 = time.perf_counter()
        pool.start_background()
        assert time.perf_counter() - t0 < 2.0
    finally:
        collective_timeout(None)
    live.add(pool)
    yield pool
    live.discard(pool)
    pool.stop()


class Spares:
    """Pools for the tests that break them: after its failure, each test starts a new pool and pings
    it, which shows a new pool starts cleanly, and leaves it as the next test's to break."""

    def __init__(self) -> None:
        self.next: WorkerPool | None = None

    def take(self) -> WorkerPool:
        pool, self.next = self.next or started("cpu[0 1]", timeout=2), None
        live.discard(pool)
        return pool

    def recover(self) -> None:
        self.next = started("cpu[0 1]", timeout=2)
        live.add(self.next)
        ping_ok(self.next)


@pytest.fixture(scope="module")
def spares() -> Iterator[Spares]:
    s = Spares()
    yield s
    if s.next is not None:
        live.discard(s.next)
        s.next.stop()


def later(seconds: float, fn: object, *args: object) -> threading.Timer:
    timer = threading.Timer(seconds, fn, args)  # type: ignore[arg-type]
    timer.start()
    return timer


# -- settings --------------------------------------------------------------------------------------

def test_collective_timeout_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pool_mod.TIMEOUT_ENV, raising=False)
    assert current_collective_timeout() == 600
    monkeypatch.setenv(pool_mod.TIMEOUT_ENV, "7.5")
    assert current_collective_timeout() == 7.5
    collective_timeout(3)
    try:
        assert current_collective_timeout() == 3
    finally:
        collective_timeout(None)
    assert current_collective_timeout() == 7.5
    monkeypatch.setenv(pool_mod.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="SHAPESCRIPT_COLLECTIVE_TIMEOUT"):
        current_collective_timeout()
    with pytest.raises(ValueError, match="positive"):
        collective_timeout(0)


@pytest.mark.parametrize("tensor", [
    torch.arange(6.0).reshape(2, 3).t(),  # not contiguous
    torch.tensor(3, dtype=torch.int64),  # 0-d
    torch.zeros(0, 4),
    torch.tensor([True, False]),
    torch.randn(3, dtype=torch.bfloat16),
    torch.randn(2, dtype=torch.complex64),
    torch.ones(2, requires_grad=True),
])
def test_tensors_travel_as_their_bytes(tensor: torch.Tensor) -> None:
    back = pickle.loads(worker_mod.dumps({"t": tensor}))["t"]
    assert back.dtype == tensor.dtype and back.requires_grad == tensor.requires_grad
    torch.testing.assert_close(back.detach(), tensor.detach(), rtol=0, atol=0)


# -- calls -----------------------------------------------------------------------------------------

def test_ping_two_workers(pool2: WorkerPool) -> None:
    ping_ok(pool2)
    assert [a["device"] for a in pool2.call("ping", ())] == ["cpu", "cpu"]
    assert pool2.cold_start_s is not None and pool2.cold_start_s > 0
    folder = pool2.folder
    assert folder is not None and stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        pool2.call("ping", ())
    rtt = (time.perf_counter() - t0) / n
    print(f"\ncpu[0 1]: cold start {pool2.cold_start_s:.2f} s, ping round trip {rtt * 1e6:.0f} us")
    assert rtt < 0.01


def test_the_same_arguments_are_pickled_once(pool2: WorkerPool, monkeypatch: pytest.MonkeyPatch) -> None:
    count = 0

    def counting(obj: object) -> bytes:
        nonlocal count
        count += 1
        return worker_mod.dumps(obj)

    monkeypatch.setattr(pool_mod, "dumps", counting)
    pool2.call("sleep", (0,))
    assert count == 1
    pool2.call("sleep", [(0,), (0,)])
    assert count == 3


def test_started_in_background_with_the_controllers_sys_path(pool3: WorkerPool, probe_dir: Path) -> None:
    ping_ok(pool3)  # waits for the start
    assert pool3.timeout == 3
    assert pool3.call("probe", ()) == [str(probe_dir / "ss_probe_handlers.py")] * 3


def test_an_error_after_a_collective_is_the_handlers_own(pool3: WorkerPool) -> None:
    with pytest.raises(WorkerError, match="^worker 0 \\(cpu:0\\) raised RuntimeError while running `fail_after_"):
        pool3.call("fail_after_collective", ())
    ping_ok(pool3)


@pytest.mark.parametrize("which", ["pool2", "pool3"])
def test_all_reduce_of_each_workers_tensor(which: str, request: pytest.FixtureRequest) -> None:
    pool: WorkerPool = request.getfixturevalue(which)
    parts = [torch.arange(4.0) * (r + 1) for r in range(pool.world)]
    for total in pool.call("all_reduce_sum", [(p,) for p in parts]):
        torch.testing.assert_close(total, sum(parts))


def test_shape_error_in_a_handler_raises_shape_error_with_the_workers_traceback(pool2: WorkerPool) -> None:
    with pytest.raises(ShapeError) as info:
        pool2.call("raise", ("train.ss:3:1: x is [3], not [4]", (1,)))
    assert str(info.value) == "train.ss:3:1: x is [3], not [4]"
    notes = "\n".join(info.value.__notes__)
    assert "worker 1's traceback (cpu:1)" in notes and "raise_shape_error" in notes
    ping_ok(pool2)


def test_a_bad_call_leaves_the_pool_working(pool2: WorkerPool) -> None:
    with pytest.raises(WorkerError, match="no handler named 'nope'"):
        pool2.call("nope", ())
    with pytest.raises(ValueError, match="3 tuples of arguments for 2 workers"):
        pool2.call("sleep", [(0,), (0,), (0,)])
    with pytest.raises(WorkerError, match="can't be sent to the workers"):
        pool2.call("sleep", (lambda: 0,))
    with pytest.raises(WorkerError, match="raised TypeError while running `sleep`") as info:
        pool2.call("sleep", ("long",))
    assert "time.sleep(seconds)" in "\n".join(info.value.__notes__)
    ping_ok(pool2)


class FromTheMainScript:
    pass


def test_the_workers_never_import_the_main_script(pool2: WorkerPool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FromTheMainScript, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "FromTheMainScript", FromTheMainScript, raising=False)
    with pytest.raises(WorkerError, match="can't read the arguments: AttributeError.*never import the controller's"):
        pool2.call("sleep", (FromTheMainScript(),))
    ping_ok(pool2)


@pytest.mark.parametrize("which", ["pool2", "pool3"])
def test_nothing_listens_beyond_loopback(which: str, request: pytest.FixtureRequest) -> None:
    pool: WorkerPool = request.getfixturevalue(which)
    per_worker = pool.call("listening_sockets", ())
    assert all(per_worker), "each worker should listen for its Gloo peers (on loopback)"
    for pid, found in [(os.getpid(), listening_sockets(os.getpid()))] + list(zip(pool.pids, per_worker)):
        for address, port in found:
            assert address in ("127.0.0.1", "::1"), f"process {pid} listens on {address}:{port}"
    from_here = [listening_sockets(pid) for pid in pool.pids]  # the handler and /proc from here agree
    assert sorted(map(sorted, per_worker)) == sorted(map(sorted, from_here))


# -- failures --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_killed_worker_raises_at_once(spares: Spares) -> None:
    pool = spares.take()
    pids = pool.pids
    timer = later(0.5, os.kill, pids[1], signal.SIGKILL)
    t0 = time.perf_counter()
    try:
        with pytest.raises(WorkerError) as info:
            pool.call("sleep", (60,), where=WHERE)
    finally:
        timer.cancel()
    assert time.perf_counter() - t0 < 5
    assert str(info.value).startswith(f"worker 1 (cpu:1) stopped while running {WHERE}: it was killed by SIGKILL")
    assert not pool.alive
    assert_no_workers_left(pids)
    with pytest.raises(WorkerError, match="were stopped after an error"):
        pool.call("ping", ())
    spares.recover()


@pytest.mark.slow
def test_worker_killed_while_the_others_wait_in_a_collective(spares: Spares) -> None:
    pool = spares.take()  # collective timeout 2 s: worker 1 is killed well before it
    pids = pool.pids
    timer = later(0.3, os.kill, pids[1], signal.SIGKILL)
    try:
        with pytest.raises(WorkerError, match="^worker 1 \\(cpu:1\\) stopped while running .*SIGKILL"):
            pool.call("hang_before_collective", (1, "train.ss:30:12"), where=WHERE)
    finally:
        timer.cancel()
    assert_no_workers_left(pids)
    spares.recover()


@pytest.mark.slow
def test_worker_that_never_answers(spares: Spares) -> None:
    pool = spares.take()  # collective timeout 2 s: worker 1 has 2 + 2 s after worker 0 answered
    pids = pool.pids
    with pytest.raises(WorkerError) as info:
        pool.call("sleep", [(0,), (60,)])
    assert str(info.value) == ("worker 1 didn't finish `sleep` within 2 s of the others:\n"
                               "  worker 0: finished\n"
                               "  worker 1: didn't answer; it was running `sleep`")
    assert_no_workers_left(pids)
    spares.recover()


@pytest.mark.slow
def test_ctrl_c_twice_stops_the_workers(spares: Spares) -> None:
    """A second Ctrl-C soon after the first stops at once (one alone waits for the step to end:
    tests/parallel/test_interrupts.py)."""
    pool = spares.take()
    pids = pool.pids
    # 1.5 s apart: a second press, not a double click (DOUBLE_CLICK_S)
    timers = [later(delay, os.kill, os.getpid(), signal.SIGINT) for delay in (0.5, 2.0)]
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            pool.call("sleep", (60,), where=WHERE)
    finally:
        for timer in timers:
            timer.cancel()
    assert info.value.__notes__ == [  # what state things are in, for the person who pressed it
        f"The workers on cpu[0 1] were stopped in the middle of {WHERE}: the models and optimizer state on them "
        f"are gone (their handles now say so). Make new ones, or restore a checkpoint; the next call starts "
        f"new workers."]
    assert not pool.alive
    assert_no_workers_left(pids)
    spares.recover()


@pytest.mark.slow
def test_stop_is_graceful(spares: Spares) -> None:
    pool = spares.take()
    pids, folder = pool.pids, pool.folder
    assert folder is not None
    t0 = time.perf_counter()
    pool.stop()
    assert time.perf_counter() - t0 < STOP_GRACE  # the workers left on the stop message, not on SIGTERM after it
    assert_no_workers_left(pids)
    assert not os.path.exists(folder)
    with pytest.raises(WorkerError, match="were stopped; start new ones"):
        pool.call("ping", ())


@pytest.mark.slow
def test_a_worker_that_cant_start() -> None:
    before = children()
    with pytest.raises(WorkerError, match="^worker \\d \\(cpu:\\d\\) failed to start: ModuleNotFoundError") as info:
        started("cpu[0 1]", modules=["ss_no_such_module"])
    assert "ss_no_such_module" in "\n".join(info.value.__notes__)
    assert children() <= before | fork_server_pids()


@pytest.mark.slow
def test_collective_timeout_says_where_each_worker_was(pool3: WorkerPool) -> None:
    """Last of the pool3 tests: it breaks that pool."""
    pids = pool3.pids
    t0 = time.perf_counter()
    with pytest.raises(WorkerError) as info:
        pool3.call("hang_before_collective", (1, "train.ss:30:12"), where=WHERE)
    assert time.perf_counter() - t0 < 10
    assert str(info.value) == (
        f"a worker failed while running {WHERE}, and worker 1 didn't finish:\n"
        "  worker 0: was waiting for the other workers at train.ss:30:12\n"
        f"  worker 1: didn't answer; it was running {WHERE}\n"
        "  worker 2: was waiting for the other workers at train.ss:30:12")
    assert "collective timeout is 3 s" in info.value.__notes__[0]
    assert "Timed out" in info.value.__notes__[1]  # gloo's own message, in worker 0's traceback
    assert_no_workers_left(pids)


CONTROLLER = """
import sys, time
from shapescript.api import parse_devices
from shapescript.parallel.pool import WorkerPool
pool = WorkerPool(parse_devices("cpu[0 1]"))
pool.start()
print(pool.folder, *pool.pids, flush=True)
pool.call("sleep", (60,))
"""


@pytest.mark.slow
def test_no_orphan_when_the_controller_is_killed() -> None:
    """The workers are busy, so they can't see the controller's socket close: each watches the
    controller's process, and once it has ended removes the pool's folder and exits (more cases in
    test_leftovers.py)."""
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER], stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert controller.stdout is not None
        folder, *pids = controller.stdout.readline().split()
        assert len(pids) == 2
        time.sleep(0.3)
    finally:
        controller.kill()
        controller.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (any(_running(pid) for pid in pids) or os.path.exists(folder)):
        time.sleep(0.05)
    assert not any(_running(pid) for pid in pids)
    assert not os.path.exists(folder)


def _running(pid: int | str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
