"""Pipelined steps: a controller's loop that only logs a step's result sends the
next step before reading this one's answer (ir/defer.py marks the call, parallel/pipeline.py runs
it). What the user sees must stay what waiting for each answer gives: the same records in the same
order, the same models, the same errors after the same steps, Ctrl-C between steps."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from programs import LIN_HEADER, LIN_LOSS, LIN_STEP, LINEAR, README
from support import importable

import shapescript as ss
from shapescript.api import parse_devices
from shapescript.parallel.interrupts import StepInterrupt
from shapescript.parallel.pool import WorkerPool

# -- which calls are sent without waiting: a fact of the typed program --------------------------------

LOOP = LIN_HEADER + LIN_LOSS + LIN_STEP + textwrap.dedent("""\

    fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink):
        for batch in data |> batches(8):
    {body}
    """)


def controller(body: str) -> str:
    body = textwrap.indent(textwrap.dedent(body), " " * 8)
    prog = ss.load(LOOP.replace("{body}\n", body), devices="cpu[0 1]", name="fit.ss")
    source = prog.python_source
    return source[source.index("def fit"):]


@pytest.mark.parametrize("body", [
    "l = step(mut m, mut opt, batch)\nwrite(log, logs(loss=l))\n",
    "write(log, logs(loss=step(mut m, mut opt, batch)))\n",
    "l = step(mut m, mut opt, batch)\nwrite(log, logs(loss=l, again=l))\n",
])
def test_a_result_only_logged_is_not_waited_for(body: str) -> None:
    assert "step.later(m, opt, batch)" in controller(body)


@pytest.mark.parametrize("body", [
    "l = step(mut m, mut opt, batch)\nwrite(log, logs(loss=l * 2.0))\n",  # computed on in the controller
    "l = step(mut m, mut opt, batch)\nk = l\nwrite(log, logs(loss=k))\n",  # read by something else
    "write(log, logs(loss=loss(m, batch) * 2.0))\n",  # not a value of logs itself
])
def test_a_result_the_controller_reads_is_waited_for(body: str) -> None:
    source = controller(body)
    assert ".later(" not in source, source


def test_only_the_controllers_module_sends_without_waiting() -> None:
    assert "step.later(" in ss.load(LINEAR, devices="cpu[0 1]", name="fit.ss").python_source
    assert ".later(" not in ss.load(LINEAR, devices="cpu", name="fit.ss").python_source
    # the debug build checks every value the program names as it runs: it waits for each
    assert ".later(" not in ss.load(LINEAR, devices="cpu[0 1]", name="fit.ss", check_types=True).python_source


# -- the pool: answers in order, a step after a failed one skipped ------------------------------------

@pytest.fixture(scope="module")
def counting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A handler module only the controller's sys.path finds: `bump` counts the calls each worker ran."""
    with importable(tmp_path_factory.mktemp("bump"), "ss_bump_handlers", """
        from shapescript.parallel.handlers import handler

        @handler("bump")
        def bump(state):
            state.bumps = getattr(state, "bumps", 0) + 1
            return state.bumps
    """) as folder:
        yield folder


def pool_of(devices: str) -> WorkerPool:
    pool = WorkerPool(parse_devices(devices), modules=["ss_bump_handlers"])
    pool.start()
    return pool


def test_answers_come_in_order_and_a_call_reads_them_first(counting: Path) -> None:
    pool = pool_of("cpu[0 1]")
    try:
        answers: list[list | None] = []
        for _ in range(3):
            pool.submit("bump", (), "`bump`", answers.append)
        assert answers == [[1, 1], [2, 2]]  # each submit read the answer before its own
        assert pool.call("bump", ()) == [4, 4]  # the third's answer was read first
        assert answers == [[1, 1], [2, 2], [3, 3]]
        pool.settle()  # nothing outstanding: nothing to do
        assert pool.call("bump", ()) == [5, 5]
    finally:
        pool.stop()


def test_a_step_sent_after_a_failed_one_never_runs(counting: Path) -> None:
    pool = pool_of("cpu[0 1]")
    try:
        answers: list[list | None] = []
        pool.submit("raise", ("every worker's own",), "`a failing step`", answers.append)
        with pytest.raises(ss.ShapeError, match="every worker's own"):
            pool.submit("bump", (), "`bump`", answers.append)
        assert answers == [None, None]
        assert pool.alive and pool.call("bump", ()) == [1, 1]  # the bump sent after the failure was skipped
        # a failed call that wasn't sent without waiting leaves the next one sent at once as it is
        with pytest.raises(ss.ShapeError):
            pool.call("raise", ("again",))
        pool.submit("bump", (), "`bump`", answers.append)
        pool.settle()
        assert answers[-1] == [2, 2]
    finally:
        pool.stop()


def test_workers_that_no_longer_agree_are_stopped(counting: Path) -> None:
    pool = pool_of("cpu[0 1]")
    try:
        pool.submit("raise", ("worker 0's own", (0,)), "`a failing step`", lambda _: None)
        with pytest.raises(ss.ShapeError, match="worker 0's own"):
            pool.submit("bump", (), "`bump`", lambda _: None)  # worker 1 ran it, worker 0 skipped it
        assert not pool.alive
        with pytest.raises(ss.WorkerError, match="disagree"):
            pool.call("ping", ())
    finally:
        pool.stop()


# -- programs: the same records, models and errors as one device ------------------------------------

def fit_on(devices: str, data: object, pipeline: str, monkeypatch: pytest.MonkeyPatch, source: str = LINEAR) -> tuple:
    """LINEAR's `fit` (or `source`'s) over `data`: its records' losses, the model after it, the error
    it raised, and the records."""
    monkeypatch.setenv("SHAPESCRIPT_PIPELINE", pipeline)
    prog = ss.load(source, devices=devices, name="fit.ss")
    try:
        m = prog.Lin.init(seed=0)
        sink = ss.sinks.memory()
        error = None
        try:
            prog.fit(m, ss.adamw(m, lr=0.1), data, sink)
        except ss.ShapeScriptError as e:
            error = f"{type(e).__name__}: {e}"
        return [r["loss"] for r in sink.records], m.state_dict()["w"].detach().clone(), error, sink.records
    finally:
        prog.stop()


@pytest.mark.slow
@pytest.mark.parametrize("devices", ["cpu[0 1]", "cpu[0 1 2]"])
def test_a_loop_gives_what_one_device_gives(devices: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from sample_data import Rows
    g = torch.Generator().manual_seed(3)
    kept = ss.TensorDataset(x=torch.randn(75, 4, generator=g), y=torch.randint(0, 3, (75,), generator=g))
    for data in (kept, Rows(45)):  # kept by the workers, and loaded item by item
        one = fit_on("cpu", data, "on", monkeypatch)
        for pipeline in ("on", "off"):
            several = fit_on(devices, data, pipeline, monkeypatch)
            assert several[2] is None and len(several[0]) == len(one[0]) == -(-len(data) // 8)
            assert several[0] == pytest.approx(one[0], abs=1e-5)
            torch.testing.assert_close(several[1], one[1], atol=1e-5, rtol=0)


# A step's result logged after another call on the workers, which reads every answer outstanding
# first: `logs` once got the pending result itself, a TypeError at the first batch.
LOGGED_AFTER = LINEAR.replace("        write(log, logs(loss=step(mut m, mut opt, batch)))\n", """\
        l = step(mut m, mut opt, batch)
        p = loss(m, batch) * 2.0
        write(log, logs(loss=l, after=p))
""")
assert LOGGED_AFTER != LINEAR


@pytest.mark.slow
def test_a_result_logged_after_another_call_is_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "step.later(m, opt, batch)" in ss.load(LOGGED_AFTER, devices="cpu[0 1]", name="fit.ss").python_source
    g = torch.Generator().manual_seed(3)
    data = ss.TensorDataset(x=torch.randn(30, 4, generator=g), y=torch.randint(0, 3, (30,), generator=g))
    one = fit_on("cpu", data, "on", monkeypatch, LOGGED_AFTER)
    assert one[2] is None and len(one[0]) == 4 and all(isinstance(loss, float) for loss in one[0])
    for devices in ("cpu[0 1]", "cpu[0 1 2]"):
        several = fit_on(devices, data, "on", monkeypatch, LOGGED_AFTER)
        assert several[2] is None and several[0] == pytest.approx(one[0], abs=1e-5)
        assert [r["after"] for r in several[3]] == pytest.approx([r["after"] for r in one[3]], abs=1e-5)
        torch.testing.assert_close(several[1], one[1], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_failing_step_ends_the_loop_where_one_device_ends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from sample_data import RowsBadAt
    data = RowsBadAt(40, 21)  # its batch fails to load, after steps that went well
    one = fit_on("cpu", data, "on", monkeypatch)
    assert one[2] is not None and "item 21" in one[2] and 0 < len(one[0]) < 5
    for pipeline in ("on", "off"):
        several = fit_on("cpu[0 1]", data, pipeline, monkeypatch)
        assert several[2] is not None and "item 21" in several[2], several[2]
        assert several[0] == pytest.approx(one[0], abs=1e-5)  # the records of the steps before it, no more
        torch.testing.assert_close(several[1], one[1], atol=1e-5, rtol=0)  # the step after it never ran


@pytest.mark.slow
def test_a_sink_gets_every_record_in_order_before_the_call_returns(tmp_path: Path) -> None:
    prog = ss.load(README.replace("batches(64)", "batches(16)"), devices="cpu[0 1]", name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        g = torch.Generator().manual_seed(0)
        data = ss.TensorDataset(img=torch.randn(160, 784, generator=g), label=torch.randint(0, 10, (160,), generator=g))
        path = tmp_path / "log.jsonl"
        with ss.sinks.jsonl(path) as sink:
            prog.run(m, ss.adamw(m, lr=1e-3), data, sink)
            import json
            steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
        assert steps == list(range(1, 11))
    finally:
        prog.stop()


# -- Ctrl-C: the steps sent end, then StepInterrupt; the model is as those steps left it -------------

IN_ORDER = LINEAR.replace("data |> shuffle(seed=1) |> batches(8)", "data |> batches(8)")


def rows(seed: int, batches: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8 * batches, 4, generator=g), torch.randint(0, 3, (8 * batches,), generator=g)


def assert_as_one_device_after(steps: int, records: list, model: object, x: torch.Tensor, y: torch.Tensor) -> None:
    """The records are one device's first `steps` losses, and the model is as those steps left it."""
    one = ss.load(IN_ORDER, devices="cpu", name="fit.ss")
    ref = one.Lin.init(seed=0)
    opt = ss.adamw(ref, lr=0.1)
    losses = [float(one.step(ref, opt, {"x": x[8 * i:8 * i + 8], "y": y[8 * i:8 * i + 8]})) for i in range(steps)]
    assert [r["loss"] for r in records] == pytest.approx(losses, abs=1e-5)
    torch.testing.assert_close(model.state_dict()["w"], ref.w.detach(), atol=1e-5, rtol=0)  # no step beyond them


@pytest.mark.slow
def test_an_interrupt_in_a_pipelined_loop_keeps_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPESCRIPT_PIPELINE", "on")
    x, y = rows(5, 3000)
    prog = ss.load(IN_ORDER, devices="cpu[0 1]", name="fit.ss")
    previous = signal.getsignal(signal.SIGINT)
    try:
        m = prog.Lin.init(seed=0)
        sink = ss.sinks.memory()
        prog.fit(m, ss.adamw(m, lr=0.1), ss.TensorDataset(x=x[:16], y=y[:16]), ss.sinks.memory())  # warm up
        m = prog.Lin.init(seed=0)
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(StepInterrupt):
            prog.fit(m, ss.adamw(m, lr=0.1), ss.TensorDataset(x=x, y=y), sink)
        timer.join()
        steps = len(sink.records)
        assert 0 < steps < 3000
        assert_as_one_device_after(steps, sink.records, m, x, y)
        time.sleep(0.1)
        assert float(prog.loss(m, {"x": x[:8], "y": y[:8]})) > 0  # the workers go on
    finally:
        signal.signal(signal.SIGINT, previous)
        prog.stop()


@pytest.mark.slow
@pytest.mark.parametrize("at_step", [1, 4])
def test_ctrl_c_just_after_a_step_is_sent_keeps_its_record(monkeypatch: pytest.MonkeyPatch, at_step: int) -> None:
    """Ctrl-C in the window after a step is sent and before the loop queues its record (here: as
    `submit` returns): the record is still written, so the sink and the models agree."""
    monkeypatch.setenv("SHAPESCRIPT_PIPELINE", "on")
    x, y = rows(6, 10)
    prog = ss.load(IN_ORDER, devices="cpu[0 1]", name="fit.ss")
    previous = signal.getsignal(signal.SIGINT)
    submit, sent = WorkerPool.submit, []

    def submit_then_ctrl_c(pool: WorkerPool, *args: object) -> None:
        submit(pool, *args)
        sent.append(args[2])
        if len(sent) == at_step:
            os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler before the next bytecode

    try:
        m = prog.Lin.init(seed=0)
        sink = ss.sinks.memory()
        monkeypatch.setattr(WorkerPool, "submit", submit_then_ctrl_c)
        with pytest.raises(StepInterrupt):
            prog.fit(m, ss.adamw(m, lr=0.1), ss.TensorDataset(x=x, y=y), sink)
        assert len(sink.records) == len(sent) == at_step
        assert_as_one_device_after(at_step, sink.records, m, x, y)
        with pytest.raises(KeyboardInterrupt):  # nothing holds Ctrl-C once the call is over
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        signal.signal(signal.SIGINT, previous)
        prog.stop()


# -- sinks: ours are written a step late, the user's before the next step is sent -------------------

class Watching(ss.sinks.Sink):
    """Notes, at each record, the model's state and how many steps the workers had been sent whose
    answers weren't read yet."""

    def __init__(self, prog: ss.api.Program, model: object, passive: bool) -> None:
        super().__init__()
        self.prog, self.model, self.passive = prog, model, passive
        self.ahead: list[int] = []
        self.states: list[torch.Tensor] = []

    def _emit(self, step: int, values: dict) -> None:
        pool = self.prog.pool
        self.ahead.append(len(pool._in_flight) if pool is not None else 0)
        if not self.passive:
            self.states.append(self.model.state_dict()["w"].detach().clone())


@pytest.mark.slow
def test_a_sink_of_the_users_sees_the_models_as_its_step_left_them() -> None:
    from sample_data import Rows
    states = {}
    for devices in ("cpu", "cpu[0 1]"):
        prog = ss.load(LINEAR, devices=devices, name="fit.ss")
        try:
            m = prog.Lin.init(seed=0)
            sink = Watching(prog, m, passive=False)
            prog.fit(m, ss.adamw(m, lr=0.1), Rows(48), sink)
            states[devices] = sink.states
            assert sink.ahead == [0] * 6  # each record written before the next step was sent
        finally:
            prog.stop()
    assert len(states["cpu[0 1]"]) == len(states["cpu"]) == 6
    for mine, one in zip(states["cpu[0 1]"], states["cpu"]):
        torch.testing.assert_close(mine, one, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_a_passive_sink_is_written_while_the_next_step_runs() -> None:
    from sample_data import Rows
    prog = ss.load(LINEAR, devices="cpu[0 1]", name="fit.ss")
    try:
        m = prog.Lin.init(seed=0)
        sink = Watching(prog, m, passive=True)
        prog.fit(m, ss.adamw(m, lr=0.1), Rows(48), sink)
        assert sink.ahead == [1] * 5 + [0]  # the next step already sent; the last one at the end
    finally:
        prog.stop()
