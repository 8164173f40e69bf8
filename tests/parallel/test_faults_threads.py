"""Worker pools under threads, forks and partial failures: two threads
sharing a program each get their own answers; a forked child's exit never stops its parent's
workers; an error raised on one worker only reaches the controller at once; workers that are all
stopped (SIGSTOP) give a WorkerError at the collective timeout instead of a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
from support import fork_server_pids

import shapescript as ss
from shapescript.api import parse_devices
from shapescript.errors import WorkerError
from shapescript.parallel import pool as pool_mod
from shapescript.parallel.pool import WorkerPool

ROOT = Path(__file__).resolve().parents[2]
WHERE = "`train_step` (train.ss:32:4)"

PROGRAM = textwrap.dedent("""\
    devices cpu[0 1]
    dim D = 3

    data Ex:
        x: [D]

    extern fn checked(x: [b D]) -> [b D] = "ss_faulty_extern.checked"

    fn centered(batch: [b] Ex) -> [b D] = batch.x - mean(batch.x, over=b)

    fn total(batch: [b] Ex) -> [D] = sum(checked(batch.x), over=b)
    """)

# Raises for an example with a value over 100: only the worker holding it raises.
EXTERN = textwrap.dedent("""\
    from shapescript.errors import DomainError

    def checked(x):
        bad = (x > 100).any(dim=1).nonzero()
        if len(bad):
            raise DomainError(f"a value over 100: {x[bad[0, 0]].tolist()}")
        return x
    """)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(autouse=True)
def no_process_left() -> Iterator[None]:
    before = children()
    yield
    deadline = time.monotonic() + 10
    while children() - before - pool_pids() - fork_server_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children() - before - pool_pids() - fork_server_pids() == set()


LIVE: list[WorkerPool] = []  # the shared pools, whose workers outlive a test


def pool_pids() -> set[int]:
    return {pid for pool in LIVE if pool.alive for pid in pool.pids}


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while any(running(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ss.Program, ss.Program]]:
    """PROGRAM on cpu[0 1], its workers started with a 120 s collective timeout, and on one device.
    The extern fn's module is on sys.path, which the workers take from the controller. The last
    test of the program on cpu[0 1] breaks its pool."""
    folder = tmp_path_factory.mktemp("extern")
    (folder / "ss_faulty_extern.py").write_text(EXTERN)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        prog = ss.load(PROGRAM, name="faulty.ss")
        try:
            ss.collective_timeout(120)
            try:
                pool = prog.workers()
            finally:
                ss.collective_timeout(None)
            LIVE.append(pool)
            yield prog, ss.load(PROGRAM, devices="cpu", name="faulty.ss")
            LIVE.remove(pool)
        finally:
            prog.stop()


@pytest.fixture(scope="module")
def pool5() -> Iterator[WorkerPool]:
    """cpu[0 1] with a 5 s collective timeout; the last test here breaks it."""
    ss.collective_timeout(5)
    try:
        pool = WorkerPool(parse_devices("cpu[0 1]"))
        pool.start()
    finally:
        ss.collective_timeout(None)
    LIVE.append(pool)
    yield pool
    LIVE.remove(pool)
    pool.stop()


def later(seconds: float, fn: object, *args: object) -> threading.Timer:
    timer = threading.Timer(seconds, fn, args)  # type: ignore[arg-type]
    timer.start()
    return timer


# -- threads ----------------------------------------------------------------------------------------

def test_two_threads_calling_one_program_each_get_their_own_results(
        programs: tuple[ss.Program, ss.Program]) -> None:
    prog, one = programs
    inputs = {k: [torch.randn(n, 3, generator=torch.Generator().manual_seed(100 * k + i)) * (k + 1)
                  for i, n in enumerate([5, 6, 7, 4] * 10)] for k in range(2)}
    expected = {k: [one.centered({"x": x}) for x in xs] for k, xs in inputs.items()}
    got: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    errors: list[BaseException] = []
    together = threading.Barrier(2)

    def run(k: int) -> None:
        try:
            together.wait()
            for x in inputs[k]:  # a mean over the batch: each call's all-reduce mixes its workers' parts
                got[k].append(prog.centered({"x": x}))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and errors == []
    for k in range(2):
        assert len(got[k]) == len(expected[k])
        for mine, reference in zip(got[k], expected[k]):
            torch.testing.assert_close(mine, reference, rtol=0, atol=1e-5)
    assert prog.pool is LIVE[0] and prog.pool.state == "running"


class SlowPool:
    """A WorkerPool that takes its time to start, and counts how many were made."""

    made = 0

    def __init__(self, devices: object, modules: object = (), launcher: object = None) -> None:
        SlowPool.made += 1
        self.alive = True

    def start(self) -> None:
        time.sleep(0.3)

    def call(self, *args: object, **kwargs: object) -> list[None]:
        return [None, None]

    def stop(self) -> None:
        self.alive = False


def test_threads_that_start_a_programs_workers_at_once_share_one_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_mod, "WorkerPool", SlowPool)
    prog = ss.load(PROGRAM, name="faulty.ss")
    together = threading.Barrier(4)
    pools: list[object] = []

    def start() -> None:
        together.wait()
        pools.append(prog.workers())

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert SlowPool.made == 1 and len(pools) == 4 and all(p is pools[0] for p in pools)
    prog.stop()
    assert not pools[0].alive  # type: ignore[attr-defined]


def test_ctrl_c_while_another_thread_calls_leaves_its_call_alone(pool5: WorkerPool) -> None:
    result: list[object] = []
    busy = threading.Thread(target=lambda: result.append(pool5.call("sleep", (3,), where=WHERE)))
    busy.start()
    deadline = time.monotonic() + 30
    while not _held_elsewhere(pool5) and time.monotonic() < deadline:  # until the other thread holds the pool
        time.sleep(0.01)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        timer = later(0.3, os.kill, os.getpid(), signal.SIGINT)
        try:
            pool5.call("ping", ())  # waits for the other thread's call: Ctrl-C ends the wait
        finally:
            timer.cancel()
    assert time.monotonic() - t0 < 2  # at Ctrl-C, not when the other call ended
    busy.join(timeout=30)
    assert result == [[0, 1]]  # the other thread's own answer
    assert pool5.alive and [a["rank"] for a in pool5.call("ping", ())] == [0, 1]


# -- one worker's error, stopped workers ---------------------------------------------------------

def test_an_error_on_one_worker_reaches_the_controller_at_once(programs: tuple[ss.Program, ss.Program]) -> None:
    prog, one = programs
    good = torch.arange(12.0).reshape(4, 3)  # 2 examples per worker
    torch.testing.assert_close(prog.total({"x": good}), one.total({"x": good}))

    def one_device_error(x: torch.Tensor) -> str:
        with pytest.raises(ss.DomainError) as info:
            one.total({"x": x})
        return str(info.value)

    both = good.clone()  # every worker raises: the first one's error, and the workers go on
    both[0, 0] = both[3, 1] = 500.0
    with pytest.raises(ss.DomainError) as info:
        prog.total({"x": both})
    assert str(info.value) == one_device_error(both)
    pool = prog.pool
    assert pool is not None
    pids = pool.pids

    only = good.clone()  # only worker 1 raises; worker 0 waits for it at the sum's all-reduce
    only[3, 1] = 500.0
    t0 = time.monotonic()
    with pytest.raises(ss.DomainError) as info:
        prog.total({"x": only})
    assert time.monotonic() - t0 < 10  # not after the collective timeout of 120 s
    assert str(info.value) == one_device_error(only)
    notes = "\n".join(info.value.__notes__)
    assert "worker 1's traceback (cpu:1)" in notes and "ss_faulty_extern.py" in notes
    # the sum goes through shared memory, where worker 0 sees that worker 1 failed:
    # it gives the step up, and the workers stay up
    assert pool.alive and pool.pids == pids
    torch.testing.assert_close(prog.total({"x": good}), one.total({"x": good}))

    # through Gloo, in the first call of its kind (fresh workers: their ledgers know no call), the
    # call is careful: worker 1 joins the sum of flags before the all-reduce worker 0 waits at, and
    # the workers stay up (runtime/ledger.py)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHAPESCRIPT_SHM_REDUCE", "off")
        prog.stop()
        ss.collective_timeout(120)
        try:
            pool = prog.workers()
        finally:
            ss.collective_timeout(None)
    pids = pool.pids
    t0 = time.monotonic()
    with pytest.raises(ss.DomainError) as info:
        prog.total({"x": only})
    assert time.monotonic() - t0 < 20
    assert str(info.value) == one_device_error(only)
    notes = "\n".join(info.value.__notes__)
    assert "worker 1's traceback (cpu:1)" in notes and "ss_faulty_extern.py" in notes
    assert pool.alive and pool.pids == pids
    torch.testing.assert_close(prog.total({"x": good}), one.total({"x": good}))
    prog.stop()  # this pool isn't the module's (LIVE)
    assert gone(pids)


def test_workers_all_stopped_give_a_worker_error_at_the_timeout(pool5: WorkerPool) -> None:
    """Last of the pool5 tests: it breaks that pool."""
    pids = pool5.pids
    stop_them = later(0.5, lambda: [os.kill(pid, signal.SIGSTOP) for pid in pids])
    rescue = later(60, lambda: [os.kill(pid, signal.SIGKILL) for pid in pids])  # never a hung test
    t0 = time.monotonic()
    try:
        with pytest.raises(WorkerError) as info:
            pool5.call("sleep", (3,), where=WHERE)
    finally:
        stop_them.cancel()
        rescue.cancel()
    assert 5 <= time.monotonic() - t0 < 20
    assert str(info.value) == (
        f"workers 0 and 1 didn't finish {WHERE}: stopped for 5 s (the collective timeout) without answering:\n"
        f"  worker 0: didn't answer; it was running {WHERE}, and is stopped (SIGSTOP, Ctrl-Z or a debugger)\n"
        f"  worker 1: didn't answer; it was running {WHERE}, and is stopped (SIGSTOP, Ctrl-Z or a debugger)")
    assert not pool5.alive
    assert gone(pids)  # continued and killed


# -- forks ------------------------------------------------------------------------------------------

FORKS = textwrap.dedent("""\
    import gc, multiprocessing, os, sys
    from shapescript.api import parse_devices
    from shapescript.errors import WorkerError
    from shapescript.parallel.pool import WorkerPool

    pool = WorkerPool(parse_devices("cpu[0 1]"))
    pool.start()
    pids = pool.pids
    print("workers", *pids, flush=True)

    def ping():
        return [a["rank"] for a in pool.call("ping", ())]

    def child(how):
        if how == "sys.exit":  # a normal exit: atexit runs the pool's finalizer
            sys.exit(0)
        if how == "stop":
            pool.stop()
            sys.exit(0)
        if how == "gc":  # the child's last reference goes: the finalizer runs
            del globals()["pool"]
            gc.collect()
        os._exit(0)

    for how in ["sys.exit", "os._exit", "stop", "gc"]:
        pid = os.fork()
        if pid == 0:
            child(how)
        _, status = os.waitpid(pid, 0)
        print(how, os.waitstatus_to_exitcode(status), ping(), flush=True)

    def mp_child(queue):
        try:
            pool.call("ping", ())
            queue.put("the child's ping was answered")
        except WorkerError as e:
            queue.put(str(e))
        pool.stop()

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=mp_child, args=(queue,))
    p.start()
    message = queue.get(timeout=60)
    p.join(60)
    print("multiprocessing", p.exitcode, ping(), flush=True)
    print("processes", os.getpid(), p.pid)
    print("message", message)
    print("same workers", pool.pids == pids, flush=True)
    pool.stop()
    """)


def test_a_forked_child_never_stops_its_parents_workers(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", FORKS], capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path)))
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    parent, child = lines.pop(6).removeprefix("processes ").split()
    assert lines[1:] == [
        "sys.exit 0 [0, 1]",
        "os._exit 0 [0, 1]",
        "stop 0 [0, 1]",
        "gc 0 [0, 1]",
        "multiprocessing 0 [0, 1]",
        f"message the workers on cpu[0 1] belong to process {parent}, from which this process ({child}) was "
        f"forked; it can't use them: start new ones here",
        "same workers True"]
    assert gone([int(p) for p in lines[0].split()[1:]])
    assert list(tmp_path.glob("shapescript-workers-*")) == []  # the private folder went with the workers


def _held_elsewhere(pool: WorkerPool) -> bool:
    """Whether another thread holds the pool's one-call-at-a-time lock (an RLock: this thread's try
    would take it even if this thread held it, which it never does here)."""
    lock = pool._lock
    if lock.acquire(blocking=False):
        lock.release()
        return False
    return True
