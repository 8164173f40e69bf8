"""Failures of workers that are Ray actors, on the simulated cluster (tests/conftest.py):
a killed worker or a lost node is a WorkerError at once naming the host, the device and Ray's death
cause; a stuck collective's table says where each worker on each host was; and stop, an interrupt,
or the controller's end (normal or killed) leave no actor, placement group or worker process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from programs import README
from ray_support import NODE, assert_same, digit_batches, eventually_nothing_left, ours_on_the_cluster, train
from support import interrupted_once, interrupted_twice

import shapescript as ss
from shapescript.api import parse_devices
from shapescript.errors import WorkerError
from shapescript.parallel import cluster as clusters
from shapescript.parallel import processes, ray_workers
from shapescript.parallel.pool import WorkerPool
from shapescript.parallel.ray_workers import ActorWorker, RayLauncher
from shapescript.parallel.worker import IDLE, UNKNOWN, describe_status

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.usefixtures("ray_cluster")

ROOT = Path(__file__).resolve().parents[2]
WHERE = "`train_step` (train.ss:32:4)"
TWO_HOSTS = "2 x cpu[0 1]"


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_gone(pids: list[int], seconds: float = 10.0) -> None:
    """The worker processes have ended (Ray's actors are processes of their own, on their node)."""
    deadline = time.monotonic() + seconds
    while any(running(pid) for pid in pids):
        assert time.monotonic() < deadline, f"worker processes left: {[pid for pid in pids if running(pid)]}"
        time.sleep(0.2)


def failure_within_10_s(prog: Any, m: Any, opt: Any, batch: dict[str, torch.Tensor]) -> str:
    """The message of the WorkerError that steps from now on raise within 10 s. (Steps, not the
    next: the workers of a removed node's raylet, killed with it, may need a moment to end, and
    a step in between runs; a killed process's step fails at once.)"""
    began = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        while True:
            prog.train_step(m, opt, batch)
            assert time.monotonic() - began < 10, "no WorkerError within 10 s"
    assert time.monotonic() - began < 10
    return str(caught.value)


def test_a_killed_worker_then_a_lost_node_are_reported_at_once_and_a_new_program_runs_after_each(
        ray_cluster: Any) -> None:
    """A third node joins, so that one of the two the workers are spread over can go (not the head,
    which this process is connected through) and leave the cluster 2 nodes for the tests after."""
    ray_cluster.add_node(**NODE)
    ray_cluster.wait_for_nodes()
    batch = digit_batches(1, 8)[0]
    reference = train("cpu", [batch])

    prog = ss.load(README, devices="cpu[0 1]", name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        prog.train_step(m, opt, batch)
        os.kill(prog.pool.pids[1], signal.SIGKILL)
        message = failure_within_10_s(prog, m, opt, batch)
        assert "worker 1 (cpu:1 at 127.0.0.1)" in message and "its Ray actor died" in message, message
    finally:
        prog.stop()
    eventually_nothing_left()

    prog = ss.load(README, devices=TWO_HOSTS, name="mlp.ss")  # a new program, on both hosts
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        assert float(prog.train_step(m, opt, batch)) == pytest.approx(reference[0][0], abs=1e-5)  # it runs
        workers = prog.pool._workers
        node = next(n for n in ray_cluster.worker_nodes if n.node_id in {w.proc.node_id for w in workers})
        lost = [w.label.split(" at ")[0] for w in workers if w.proc.node_id == node.node_id]  # "cpu:0 on host 1"
        ray_cluster.remove_node(node, allow_graceful=False)
        message = failure_within_10_s(prog, m, opt, batch)
        assert any(label in message for label in lost), message
        assert "its Ray actor died" in message, message  # Ray's death cause, not only a closed connection
    finally:
        prog.stop()
    eventually_nothing_left()
    # The cluster takes the node for dead once its health checks fail (tests/ray_support.py: within seconds);
    # until then it could place a new program's workers there.
    deadline = time.monotonic() + 30
    while any(n["Alive"] for n in ray.nodes() if n["NodeID"] == node.node_id):
        assert time.monotonic() < deadline, "the cluster still takes the removed node for alive"
        time.sleep(0.2)
    assert_same(reference, train(TWO_HOSTS, [batch]))


@pytest.fixture
def remote_statuses(monkeypatch: pytest.MonkeyPatch) -> RayLauncher:
    """A launcher in a controller that doesn't see the workers' /proc, as on another host: their
    statuses are read by actors on their hosts."""
    monkeypatch.setattr(ray_workers, "process_space", lambda: "another machine")  # the actors' own stays
    here = clusters.current()
    assert here is not None
    return RayLauncher(here)


def assert_seen_stopped(worker: ActorWorker, seconds: float = 10.0) -> None:
    """The actors on its host say it is stopped. A SIGSTOP lands when the kernel next schedules
    every thread of the process, so until /proc here shows it stopped its own actor may still
    answer "running"; and on a loaded machine a look may go unanswered (unknown). Both are asked
    again, within `seconds`; an answer of "stopped" must come from a peer."""
    deadline = time.monotonic() + seconds
    while not processes.is_stopped(worker.proc.pid):
        assert time.monotonic() < deadline, "the SIGSTOP never took effect"
        time.sleep(0.01)
    while True:
        worker.proc._seen = None  # a fresh look, not the one kept for LOOK_FRESH
        if worker.stopped():
            return
        assert time.monotonic() < deadline, f"its peer never saw it stopped: {worker.proc.look()}"
        time.sleep(0.1)


def test_a_stuck_collective_says_where_each_worker_on_each_host_was(remote_statuses: RayLauncher) -> None:
    pool = WorkerPool(parse_devices(TWO_HOSTS), timeout=2, launcher=remote_statuses)
    try:
        pool.start()
        workers = list(pool._workers)
        assert all(isinstance(w, ActorWorker) and w.status_path == "" for w in workers)
        # A stopped worker can't answer for itself: its peer on the same host reads it.
        os.kill(workers[3].proc.pid, signal.SIGSTOP)
        try:
            assert_seen_stopped(workers[3])
            assert workers[3].status() == (IDLE, "")
        finally:
            os.kill(workers[3].proc.pid, signal.SIGCONT)
        began = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            pool.call("hang_before_collective", (3, "train.ss:30:12"), where=WHERE)
        assert time.monotonic() - began < 10
    finally:
        pool.stop()
    waiting = "was waiting for the other workers at train.ss:30:12"
    assert str(caught.value) == (  # as on local workers (tests/parallel/test_pool.py), with each one's host
        f"a worker failed while running {WHERE}, and worker 3 didn't finish:\n"
        f"  worker 0 (cpu:0 on host 0 at 127.0.0.1): {waiting}\n"
        f"  worker 1 (cpu:1 on host 0 at 127.0.0.1): {waiting}\n"
        f"  worker 2 (cpu:0 on host 1 at 127.0.0.1): {waiting}\n"
        f"  worker 3 (cpu:1 on host 1 at 127.0.0.1): didn't answer; it was running {WHERE}")
    assert "collective timeout is 2 s" in caught.value.__notes__[0]
    eventually_nothing_left()
    workers[0].proc._seen = None  # its host's actors are gone: nothing answers
    assert workers[0].status() == (UNKNOWN, "") and not workers[0].stopped()
    assert "unknown" in describe_status(*workers[0].status())


def test_a_call_that_ends_normally_asks_no_actor_for_a_workers_status(
        remote_statuses: RayLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a call waits, whether the workers on other hosts are alive is Ray's to say (their `serve`
    tasks); what each is doing is asked of the actors only when a report needs it, and whether all
    are stopped a tenth of the collective timeout apart (failures.StoppedLooks): nothing during a
    call shorter than that, a look when asked afterwards."""
    asked: list[int] = []
    ask = ray_workers._ActorProcess._ask_lookers

    def counted(proc: Any) -> Any:
        asked.append(proc.pid)
        return ask(proc)
    monkeypatch.setattr(ray_workers._ActorProcess, "_ask_lookers", counted)
    pool = WorkerPool(parse_devices("cpu[0 1]"), timeout=60, launcher=remote_statuses)
    try:
        pool.start()
        assert all(w.status_path == "" for w in pool._workers)
        asked.clear()
        began = time.monotonic()
        assert pool.call("sleep", (2.0,), where="`a long step`") == [0, 1]
        assert time.monotonic() - began >= 2.0
        assert asked == []  # formerly a look at each of the wait's wakes, 4 a second
        # A report's look. The worker says it is idle just after its reply has gone, which on a loaded
        # machine may be after the controller has the reply: looked at until it does.
        deadline = time.monotonic() + 30.0
        while pool._workers[1].status() != (IDLE, "") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool._workers[1].status() == (IDLE, "") and not pool._workers[1].stopped()
        assert asked and set(asked) == {pool._workers[1].proc.pid}  # taken when asked for, of that worker
    finally:
        pool.stop()
    eventually_nothing_left()


def test_ctrl_c_on_the_cluster_as_on_local_workers(no_stray_interrupts: None) -> None:
    """One Ctrl-C waits for the step, and the models stay; a second soon after stops the workers at
    once, and nothing of theirs is left on the cluster (tests/parallel/test_interrupts.py: locally)."""
    prog = ss.load(README, devices="cpu[0 1]", name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        before = m.w1
        pool = prog.workers()
        assert all(w.status_path.startswith("/proc/") for w in pool._workers)  # this machine's: read directly
        interrupted_once(pool)
        assert pool.alive and torch.equal(m.w1, before)
        prog.train_step(m, opt, digit_batches(1, 8)[0])
        assert not torch.equal(m.w1, before)

        pids = pool.pids
        interrupted_twice(pool)
        assert not pool.alive
    finally:
        prog.stop()
    eventually_nothing_left()
    assert_gone(pids)


CONTROLLER = """
import sys, time
import torch
import shapescript as ss

address, program, ending = sys.argv[1:]
ss.cluster(address)
prog = ss.load(open(program).read(), devices="cpu[0 1]", name="mlp.ss")
m = prog.Mlp.init(seed=0)
prog.train_step(m, ss.adamw(m, lr=1e-3), {"img": torch.randn(8, 784), "label": torch.arange(8) % 10})
print(*prog.pool.pids, flush=True)
sys.stdin.readline()  # until the test has seen the workers on the cluster
if ending == "killed":
    time.sleep(600)  # until the test kills this process
"""


def test_nothing_left_when_the_controller_exits_or_is_killed(ray_cluster: Any, tmp_path: Path) -> None:
    """Two controllers at once, each with a program's workers on the cluster: one exits without
    stopping them, one is killed (SIGKILL: no finalizer runs). Ray ends each job's actors and
    placement groups (none is detached), with their processes."""
    program = tmp_path / "mlp.ss"
    program.write_text(README)
    controllers = {ending: subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, ray_cluster.address, str(program), ending],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
        for ending in ("exits", "killed")}
    try:
        pids = {ending: [int(p) for p in c.stdout.readline().split()]  # type: ignore[union-attr]
                for ending, c in controllers.items()}
        assert all(len(p) == 2 for p in pids.values()), {e: c.communicate(timeout=30) for e, c in controllers.items()}
        actors, groups = ours_on_the_cluster()
        assert len(actors) == 4 and len(groups) == 2  # what must go is there to see
        for c in controllers.values():
            c.stdin.write("go on\n")  # type: ignore[union-attr]
            c.stdin.flush()  # type: ignore[union-attr]
        controllers["killed"].kill()
        ended = {ending: c.wait(timeout=60) for ending, c in controllers.items()}
    finally:
        for c in controllers.values():
            c.kill()
        errors = {ending: c.communicate()[1] for ending, c in controllers.items()}
    assert ended == {"exits": 0, "killed": -signal.SIGKILL}, errors
    assert "Traceback" not in errors["exits"], errors["exits"]
    eventually_nothing_left(20.0)
    assert_gone(pids["exits"] + pids["killed"])
