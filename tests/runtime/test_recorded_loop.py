"""A one-device program's own loop recorded (runtime/recorded.py): `run`'s calls of `train_step` go
through the device's recorder as calls from Python do, its steps' own calls don't; and where the
recorder's report is read (Program.recording(), the "recording" handler, `%shapescript status`).
On the CPU with test_recorded.py's stand-in for CUDA graphs (tests/recorded_support.py); then on a
GPU where one is present."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from programs import CUDA_NET, README
from recorded_support import FakeGraphs, data, state_of, table

import shapescript as ss
from shapescript import api
from shapescript.lower import codegen
from shapescript.lower.targets import Target
from shapescript.runtime import recorded

WRAPPED = "_recorded.step(DEVICE, 'train_step', train_step, (m, opt, batch))"


def cuda_program_on_cpu(monkeypatch: pytest.MonkeyPatch, source: str = README) -> Any:
    """The program as `devices cuda[0]` builds it (its RECORDABLE table, its loop's wrapped calls),
    its tensors on the CPU: as if cuda:0 were the CPU."""
    with monkeypatch.context() as patch:
        patch.setattr(codegen, "device_of", lambda devices: "cpu")
        prog = ss.load(source, devices="cuda[0]")
    monkeypatch.setattr(api, "require_visible", lambda *args: None)  # no GPU needed to call it
    assert prog.namespace["DEVICE"] == "cpu" and WRAPPED.split("(")[0] in prog.python_source
    return prog


def dataset(rows: int, seed: int = 5) -> Any:
    """README digits, labelled by a fixed linear teacher so that training makes progress."""
    whole = data([rows], seed)[0]
    return ss.TensorDataset(img=whole["img"], label=whole["label"])


class LoopRun:
    """The README's `run` on a faked cuda:0, its steps recorded with stand-in graphs, beside a cpu
    build's `run` on the same data, every step eager."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.prog = cuda_program_on_cpu(monkeypatch)
        self.eager = ss.load(README, devices="cpu")
        self.m, self.ref = self.prog.Mlp.init(seed=0), self.eager.Mlp.init(seed=0)
        self.opt, self.ref_opt = ss.adamw(self.m, lr=1e-3), ss.adamw(self.ref, lr=1e-3)
        self.graphs = FakeGraphs(state_of(self.m, self.opt), lambda: recorded._settings(self.opt.torch_opt))
        self.recorder = recorded.Recorder(torch.device("cpu"), graphs=self.graphs)
        monkeypatch.setitem(recorded._recorders, "cpu", self.recorder)
        self.sink, self.ref_sink = ss.sinks.memory(), ss.sinks.memory()

    def epoch(self, data: Any) -> None:
        self.prog.run(self.m, self.opt, data, self.sink)
        self.eager.run(self.ref, self.ref_opt, data, self.ref_sink)

    def assert_matches_eager(self) -> None:
        losses = [r["loss"] for r in self.sink.records]
        assert losses == pytest.approx([r["loss"] for r in self.ref_sink.records], abs=1e-6)
        torch.testing.assert_close(self.m.w1, self.ref.w1, atol=1e-6, rtol=0)
        torch.testing.assert_close(self.m.w2, self.ref.w2, atol=1e-6, rtol=0)


# -- the lowering: which calls go through the recorder -------------------------------------------

def test_only_the_loops_call_goes_through_the_recorder() -> None:
    built = ss.build(README, devices="cuda[0]")
    assert built.count("_recorded.step(") == 1
    assert f"        l = {WRAPPED}  #" in built  # in run's loop
    # A step's own calls run inside its capture: train_step's loss, loss's forward, as written
    assert "_rt.value_and_grad(loss, m, batch)" in built
    assert "_F.cross_entropy(forward(m, batch.img), batch.label)" in built
    assert "from shapescript.runtime import recorded as _recorded" in built
    worker = ss.build(README, devices="cuda[0 1]", target=Target.WORKER)
    assert worker.count("_recorded.step(") == 1  # a worker prints run too (the controller runs it): harmless


def test_cpu_modules_and_programs_without_a_loop_wrap_nothing() -> None:
    for built in (ss.build(README, devices="cpu"), ss.build(README, devices="cuda[0]", standalone=True),
                  ss.build(README, devices="cuda[0 1]", target=Target.CONTROLLER),
                  ss.build(README.split("fn run(")[0], devices="cuda[0]")):
        assert "_recorded" not in built


HELPER = """
fn helper(m: Net, x: [b D]) -> Net:
    y = logits(m, x)
    return m

fn helped(m: Net, x: [b D]) -> [b C] = logits(helper(m, x), x)

fn helper_alone(m: Net, x: [b D]) -> Net:
    y = logits(m, x)
    return m
"""


def test_a_helper_that_a_step_runs_does_not_wrap_its_calls() -> None:
    # helper takes no step's place (it returns a model) but the step `helped` runs it: its call of
    # logits is inside helped's capture. helper_alone, which no step runs, wraps its call.
    built = ss.build(CUDA_NET + HELPER)
    assert table(CUDA_NET + HELPER) == ("logits", "loss", "step", "helped")
    assert "write(log, _rt.logs(loss=_recorded.step(DEVICE, 'step', step, (m, opt, batch))))" in built
    helper, alone = built.split("def helper(")[1].split("def helper_alone(")
    assert "    y = logits(m, x)  #" in helper and "_recorded" not in helper
    assert "    y = _recorded.step(DEVICE, 'logits', logits, (m, x))  #" in alone
    assert "_F.cross_entropy(logits(m, batch.x), batch.y)" in built


def test_user_names_cannot_meet_the_recorders() -> None:
    source = README.replace("train_step", "DEVICE").replace("fn run(", "fn _recorded(")
    built = ss.build(source, devices="cuda[0]")
    assert "def ss_DEVICE(" in built and "def ss__recorded(" in built
    assert "l = _recorded.step(DEVICE, 'ss_DEVICE', ss_DEVICE, (m, opt, batch))" in built


def test_the_loops_calls_reach_the_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    # The loop's call reaches the recorder: one that bypasses it would run every step eagerly
    run = LoopRun(monkeypatch)
    calls: list[str] = []
    monkeypatch.setattr(run.recorder, "call", lambda name, fn, values, extra=None: calls.append(name) or fn(*values))
    run.epoch(dataset(64 * 2))
    assert calls == ["train_step", "train_step"]


# -- the loop, recorded --------------------------------------------------------------------------

def test_runs_loop_records_train_step_and_matches_eager_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    run = LoopRun(monkeypatch)
    epoch = dataset(64 * 12 + 10)
    assert run.prog.recording() == {"forward": "not called yet", "loss": "not called yet",
                                    "train_step": "not called yet"}
    run.epoch(epoch)
    # The first call makes AdamW's state, WARMUP eager calls, a capture; the batch of 10 runs eagerly
    assert run.graphs.captures == 1
    assert run.graphs.replays == 12 - 1 - recorded.WARMUP
    run.epoch(epoch)  # the next epoch replays every batch of 64: the batch of 10 breaks no streak
    assert run.graphs.captures == 1
    assert run.graphs.replays == 12 - 1 - recorded.WARMUP + 12
    assert len(run.sink.records) == 2 * 13
    run.assert_matches_eager()
    assert run.sink.records[-2]["loss"] < run.sink.records[0]["loss"]
    assert run.prog.recording()["train_step"] == f"recorded (replays {run.graphs.replays})"
    assert run.prog.recording()["loss"] == "not called yet"  # inside train_step's graph, never on its own


def test_calls_from_python_and_from_the_loop_share_one_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    run = LoopRun(monkeypatch)
    for batch in data([64] * 5, seed=7):
        run.prog.train_step(run.m, run.opt, batch)
        run.eager.train_step(run.ref, run.ref_opt, batch)
    assert run.graphs.captures == 1 and run.graphs.replays == 1
    run.epoch(dataset(64 * 3))
    assert run.graphs.captures == 1 and run.graphs.replays == 4
    run.assert_matches_eager()


# -- the report ----------------------------------------------------------------------------------

def test_a_cpu_program_reports_nothing() -> None:
    assert ss.load(README, devices="cpu").recording() == {}


def test_recording_off_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    prog = ss.load(README.split("fn run(")[0], devices="cuda[0]")  # reading the report needs no GPU
    monkeypatch.setattr(recorded, "enabled", False)
    monkeypatch.delitem(recorded._recorders, "cuda:0", raising=False)
    off = f"not recorded: recording is off ({recorded.RECORD_ENV}=off)"
    assert prog.recording() == {"forward": off, "loss": off, "train_step": off}


def test_the_workers_handler_answers_its_report(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from shapescript.parallel import program_handlers

    assert program_handlers.recording(SimpleNamespace()) == {}  # before a program is loaded
    run = LoopRun(monkeypatch)
    run.epoch(dataset(64 * 6))
    worker = SimpleNamespace(program=run.prog.namespace)
    assert program_handlers.recording(worker)["train_step"] == "recorded (replays 2)"
    cpu = ss.load(README, devices="cpu[0 1]")
    namespace: dict[str, Any] = {"__name__": "worker_module"}
    exec(compile(cpu.worker_source, "worker", "exec"), namespace)
    assert program_handlers.recording(SimpleNamespace(program=namespace)) == {}


def test_the_status_table_says_what_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    from shapescript.notebook import workers

    run = LoopRun(monkeypatch)
    assert "Recorded steps (CUDA graphs): none called yet (recordable: forward, loss, train_step)." in \
        workers.status_table(run.prog, {}).text
    run.epoch(dataset(64 * 6))
    assert "Recorded steps (CUDA graphs): train_step: recorded (replays 2)." in workers.status_table(run.prog, {}).text
    cpu = workers.status_table(ss.load(README, devices="cpu"), {}).text
    assert "ecord" not in cpu
    # Several workers: one line where they agree, one a worker where they don't
    same = {"train_step": "recorded (replays 120)", "loss": "not called yet"}
    assert workers.recording_notes([same, same]) == ["Recorded steps (CUDA graphs): train_step: recorded (replays 120)."]
    behind = {"train_step": "warming up (2 of 3 calls)", "loss": "not called yet"}
    assert workers.recording_notes([same, behind]) == [
        "Recorded steps on worker 0: train_step: recorded (replays 120).",
        "Recorded steps on worker 1: train_step: warming up (2 of 3 calls)."]
    assert workers.recording_notes([{}, {}]) == [] and workers.recording_notes([]) == []


# -- capturable AdamW against plain AdamW ---------------------------------------------------------
#
# A recorded run's AdamW is capturable (its step count on the device), a run with recording off has
# plain AdamW. Both take the step lr * m^ / (sqrt(v^) + eps) with m^ = m / (1 - b1^t) and
# v^ = v / (1 - b2^t), but the capturable kernels compute b^t in float32 on the device, the plain ones
# in float64 in Python. float32 b^t is off by up to about an ulp (6e-8; 0.999 itself by 1.3e-8),
# and 1 - b2^t (0.001 t while t is small) turns that into a relative error of 1e-5 or so: every
# recorded step is the plain step times (1 - rho_t), rho_t ~ 6e-6 on average, the same for every
# weight. A recorded run is a plain run whose lr is smaller by ~1e-5 (on the CPU, capturable AdamW
# with the README's model and data matches a plain one with lr * (1 - 6.4e-6) 18 times closer than
# a plain one with lr). So what the comparison can promise scales with RHO, a bound on rho_t:
# - a loss after k steps moves by RHO x its sensitivity to ln(lr), which for this model, data and lr
#   is at most 1.3 over 42 steps (plain runs at lr and lr * (1 - 1e-3..1e-5), on the CPU: a property
#   of the training, not of the device): 3.9e-5 at most; an H200 saw 1.06e-5 against an earlier
#   bound of 1e-5. LOSS_TOLERANCE leaves a factor 2.5 for the rest of float32's rounding.
# - a weight moves by RHO x how far training moved it, except where the shift flips a ReLU for a
#   row: that unit's gradients then differ, and AdamW, which divides each gradient by its own running
#   size, turns that into steps of up to lr (1e-3 of the distance trained, relatively, in the CPU runs
#   above). WEIGHT_TOLERANCE bounds |w_recorded - w_off| / |w_off - w_init| per tensor.
# A stale batch, a missed or doubled step or a wrong captured lr moves the losses by 1e-2 or more and
# the weights by 5e-2 of their distance or more: both bounds still catch every one.
RHO = 3e-5  # float32 b^t's error through 1 - b^t (1.0e-5 on the CPU), with room for the GPU's powf
LOSS_TOLERANCE = 1e-4
WEIGHT_TOLERANCE = 5e-3


def test_capturable_adamw_steps_are_the_plain_ones_within_rho() -> None:
    """The factor sqrt(1 - b2^t) / (1 - b1^t) that scales every AdamW step, as the capturable kernels
    compute it (float32 powers on tensors of step counts) against float64, over 10,000 steps: within
    RHO / 2 (the other half for the GPU's pow), and truly different (why the runs differ at all)."""
    (b1, b2), steps = (0.9, 0.999), torch.arange(1, 10_001, dtype=torch.float32)
    float32 = [(1 - p).double() for p in torch._foreach_pow(b1, [steps]) + torch._foreach_pow(b2, [steps])]
    exact = [1 - b ** steps.double() for b in (b1, b2)]
    rho = (float32[1].sqrt() / float32[0]) / (exact[1].sqrt() / exact[0]) - 1
    assert rho.abs().max() <= RHO / 2
    assert rho[:42].abs().mean() >= 1e-6


# -- on a GPU ------------------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@needs_gpu
def test_readme_run_recorded_on_cuda0_matches_recording_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert recorded.recorder_for("cuda:0") is not None, "recording is off (SHAPESCRIPT_RECORD)"
    epoch = dataset(64 * 20 + 10)
    prog = ss.load(README, devices="cuda[0]")
    m, start = prog.Mlp.init(seed=0), prog.Mlp.init(seed=0)
    opt, sink = ss.adamw(m, lr=1e-3), ss.sinks.memory()
    prog.run(m, opt, epoch, sink)
    prog.run(m, opt, epoch, sink)
    assert prog.recording()["train_step"] == f"recorded (replays {20 - 1 - recorded.WARMUP + 20})"
    with monkeypatch.context() as off:  # as SHAPESCRIPT_RECORD=off: plain optimizers, no recorder
        off.setattr(recorded, "enabled", False)
        off.setitem(recorded._recorders, "cuda:0", None)
        eager = ss.load(README, devices="cuda[0]")
        ref = eager.Mlp.init(seed=0)
        ref_opt, ref_sink = ss.adamw(ref, lr=1e-3), ss.sinks.memory()
        assert ref_opt.torch_opt.param_groups[0]["capturable"] is False
        eager.run(ref, ref_opt, epoch, ref_sink)
        eager.run(ref, ref_opt, epoch, ref_sink)
        assert eager.recording()["train_step"].startswith("not recorded: recording is off")
    # Capturable against plain AdamW: within what float32's b^t allows (RHO, above)
    losses = [r["loss"] for r in sink.records]
    assert losses == pytest.approx([r["loss"] for r in ref_sink.records], abs=LOSS_TOLERANCE)
    for name in ("w1", "w2"):
        got, want, init = (getattr(x, name) for x in (m, ref, start))
        moved = float((got - want).norm() / (want - init).norm())
        assert moved <= WEIGHT_TOLERANCE, f"{name}: {moved:.2e} of the distance trained"
    assert losses[-2] < losses[0]
