"""Recorded steps (runtime/recorded.py): which functions the lowering lets a cuda device record, and
the recorder's logic, run on the CPU with a stand-in for CUDA graphs, against eager runs of the same
steps; then, where a GPU is present, the README's MLP recorded on it against its eager steps."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from programs import CUDA_NET, README
from recorded_support import FakeGraphs, data, recorded_and_eager, state_of, table
from support import ROOT

import shapescript as ss
from shapescript.lower.targets import Target
from shapescript.runtime import collectives, recorded
from shapescript.runtime.data import Batch
from shapescript.runtime.model import Model
from shapescript.runtime.modes import Eval

# -- the lowering's table ------------------------------------------------------------------------

def test_table_names_the_functions_whose_steps_are_device_work_only() -> None:
    # logits, loss, step: device work only. noisy and calls_noisy: a Mode (dropout's draws count in
    # Python); normed and calls_normed: an extern fn, directly and through a callee; run: a loop and a
    # sink, in the controller.
    assert table(CUDA_NET) == ("logits", "loss", "step")
    assert table(CUDA_NET, devices="cuda[0 1]", target=Target.WORKER) == ("logits", "loss", "step")
    assert table(README, devices="cuda[0]") == ("forward", "loss", "train_step")


def test_a_branch_on_a_tensors_value_is_not_recorded_and_a_counted_loop_is() -> None:
    """A replay would take the branch the capture took; a loop of known passes, or a branch on a
    plain number (part of the step's signature), replays as it ran."""
    source = CUDA_NET + (
        "\nfn halved(m: Net, x: [b D]) -> [b C]:\n    y = logits(m, x)\n    if sum(y) > 0.0:\n"
        "        y = y * 0.5\n    return y\n"
        "\nfn repeated(m: Net, x: [b D], k: int) -> [b C]:\n    y = logits(m, x)\n    for i in range(3):\n"
        "        if k > i:\n            y = y * 2.0\n    return y\n")
    assert table(source) == ("logits", "loss", "step", "repeated")


def test_table_only_where_a_cuda_device_runs_the_module() -> None:
    # cpu modules print as before, and neither the controller nor a standalone build has any use for it
    assert table(CUDA_NET, devices="cpu") is None
    assert table(CUDA_NET, devices="cpu[0 1]", target=Target.WORKER) is None
    assert table(CUDA_NET, devices="cuda[0 1]", target=Target.CONTROLLER) is None
    assert table(CUDA_NET, devices="cuda[0]", standalone=True) is None


def test_a_user_name_recordable_is_renamed() -> None:
    source = CUDA_NET.replace("fn logits(", "fn RECORDABLE(").replace("logits(m, batch.x)", "RECORDABLE(m, batch.x)")
    built = ss.build(source)
    assert "def ss_RECORDABLE(" in built
    assert table(source) == ("ss_RECORDABLE", "loss", "step")  # the names the module binds


# -- the recorder, with stand-ins for CUDA graphs (recorded_support.FakeGraphs) ------------------

class Run:
    """The README's MLP on the CPU, its train_step recorded by a recorder with fake graphs (through
    api.Function, as a one-device cuda program's calls go), beside the same steps run eagerly."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **recorder: Any) -> None:
        self.prog = ss.load(README, devices="cpu")
        self.eager = ss.load(README, devices="cpu")  # no RECORDABLE: every call eager
        # As a cuda build's module would have it (the cpu one has no table)
        self.prog.namespace["RECORDABLE"] = table(README, devices="cuda[0]")
        self.m, self.ref = self.prog.Mlp.init(seed=0), self.eager.Mlp.init(seed=0)
        self.opt, self.ref_opt = ss.adamw(self.m, lr=1e-3), ss.adamw(self.ref, lr=1e-3)
        self.graphs = FakeGraphs(state_of(self.m, self.opt), lambda: recorded._settings(self.opt.torch_opt),
                                 recorder.pop("fail", None))
        self.recorder = recorded.Recorder(torch.device("cpu"), graphs=self.graphs, **recorder)
        monkeypatch.setitem(recorded._recorders, "cpu", self.recorder)
        self.losses: list[float] = []
        self.ref_losses: list[float] = []

    def steps(self, batches: list[dict[str, torch.Tensor]]) -> None:
        for batch in batches:
            self.losses.append(float(self.prog.train_step(self.m, self.opt, batch)))
            self.ref_losses.append(float(self.eager.train_step(self.ref, self.ref_opt, batch)))

    def set_lr(self, lr: float) -> None:
        for opt in (self.opt, self.ref_opt):
            for group in opt.torch_opt.param_groups:
                group["lr"] = lr

    def assert_matches_eager(self) -> None:
        assert self.losses == pytest.approx(self.ref_losses, abs=1e-6)
        torch.testing.assert_close(self.m.w1, self.ref.w1, atol=1e-6, rtol=0)
        torch.testing.assert_close(self.m.w2, self.ref.w2, atol=1e-6, rtol=0)

    def status(self) -> str:
        return self.recorder.report()["train_step"]


# -- the recorder, on the CPU --------------------------------------------------------------------

def test_steps_replay_after_warm_up_and_match_eager_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(monkeypatch)
    run.steps(data([64] * 12))
    # The first call makes AdamW's state (another signature), then WARMUP eager calls, then capture
    assert run.graphs.captures == 1
    assert run.graphs.replays == 12 - 1 - recorded.WARMUP
    assert run.status() == "recorded (replays 8)"  # the capturing call's step is a replay too
    run.assert_matches_eager()
    assert run.losses[-1] < run.losses[0]


def test_each_call_copies_its_batch_into_the_graphs_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    # The check the test above relies on: replays that skipped the copy would train on one batch
    def without_copy(self: recorded.Recorded, values: Any) -> Any:
        self.graph.replay()
        return recorded._copied(self.outputs)

    monkeypatch.setattr(recorded.Recorded, "replay", without_copy)
    run = Run(monkeypatch)
    run.steps(data([64] * 8))
    assert run.graphs.replays == 8 - 1 - recorded.WARMUP
    assert run.losses[:5] == pytest.approx(run.ref_losses[:5], abs=1e-6)
    assert run.losses[5:] != pytest.approx(run.ref_losses[5:], abs=1e-3)


def test_a_smaller_last_batch_runs_eagerly_and_keeps_the_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(monkeypatch)
    epoch = [64] * 6 + [10]
    run.steps(data(epoch * 3))
    assert run.graphs.captures == 1  # the batch of 10 never comes WARMUP times in a row
    assert run.graphs.replays == 3 * 6 - 1 - recorded.WARMUP
    run.assert_matches_eager()


def test_a_batch_size_that_keeps_coming_is_captured_in_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(monkeypatch)
    run.steps(data([64] * 6 + [32] * 6))
    assert run.graphs.captures == 2
    assert run.graphs.replays == (6 - 1 - recorded.WARMUP) + (6 - recorded.WARMUP)
    run.assert_matches_eager()


def test_a_changed_learning_rate_is_captured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(monkeypatch)
    batches = data([64] * 14)
    run.steps(batches[:7])
    assert run.graphs.captures == 1
    run.set_lr(3e-3)  # the fake graph refuses to replay with the old settings
    run.steps(batches[7:])
    assert run.graphs.captures == 2
    assert run.graphs.replays == (7 - 1 - recorded.WARMUP) + (7 - recorded.WARMUP)
    run.assert_matches_eager()


def test_a_capture_that_fails_runs_the_step_eagerly_and_never_again(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(monkeypatch, fail=RuntimeError("operation not permitted when stream is capturing"))
    run.steps(data([64] * 10))
    assert run.graphs.captures == 1 and run.graphs.replays == 0
    assert run.status() == ("not recorded: capture failed: RuntimeError: operation not permitted when "
                            "stream is capturing")
    run.assert_matches_eager()  # every step ran, the one whose capture failed too


def test_a_worker_that_could_not_capture_makes_every_worker_run_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[bool, str]] = []

    def others_failed(ok: bool, device: torch.device, where: str) -> bool:
        asked.append((ok, where))
        return False  # another worker's capture failed

    run = Run(monkeypatch, agree=others_failed)
    monkeypatch.setattr(run.recorder, "world", lambda: 2)
    run.steps(data([64] * 10))
    assert asked == [(True, "recording `train_step`")]  # once, after the one capture
    assert run.graphs.captures == 1 and run.graphs.replays == 0
    assert run.status() == "not recorded: another worker couldn't record it"
    run.assert_matches_eager()


def honest_workers() -> tuple[list[bool], Callable[[bool, torch.device, str], bool]]:
    """An agreement in which every other worker did as this one: (what it was asked, the agreement)."""
    asked: list[bool] = []

    def everyone(ok: bool, device: torch.device, where: str) -> bool:
        asked.append(ok)
        return ok

    return asked, everyone


def test_workers_that_all_captured_replay_and_agree_once(monkeypatch: pytest.MonkeyPatch) -> None:
    asked, everyone = honest_workers()
    run = Run(monkeypatch, agree=everyone)
    monkeypatch.setattr(run.recorder, "world", lambda: 2)
    run.steps(data([64] * 10))
    assert asked == [True]
    assert run.graphs.replays == 10 - 1 - recorded.WARMUP
    run.assert_matches_eager()


def test_a_worker_whose_capture_failed_tells_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    asked, everyone = honest_workers()
    run = Run(monkeypatch, agree=everyone, fail=RuntimeError("capture"))
    monkeypatch.setattr(run.recorder, "world", lambda: 2)
    run.steps(data([64] * 8))
    assert asked == [False]
    run.assert_matches_eager()


def test_no_replay_while_collectives_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(monkeypatch)
    batches = data([64] * 12)
    run.steps(batches[:6])
    replays = run.graphs.replays
    monkeypatch.setattr(collectives, "recorded", [])  # as the record_collectives handler does
    run.steps(batches[6:9])
    assert run.graphs.replays == replays  # eager: a replay would record no collective
    monkeypatch.setattr(collectives, "recorded", None)
    run.steps(batches[9:])
    assert run.graphs.replays == replays + 3
    run.assert_matches_eager()


def test_a_new_model_is_another_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(monkeypatch)
    run.steps(data([64] * 6))
    other = run.prog.Mlp.init(seed=1)
    other_opt = ss.adamw(other, lr=1e-3)
    reference = run.eager.Mlp.init(seed=1)
    reference_opt = ss.adamw(reference, lr=1e-3)
    for batch in data([64] * 3, seed=9):
        got = run.prog.train_step(other, other_opt, batch)
        want = run.eager.train_step(reference, reference_opt, batch)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert run.graphs.replays == 6 - 1 - recorded.WARMUP  # none of `other`'s calls replayed m's graph
    torch.testing.assert_close(other.w1, reference.w1, atol=1e-6, rtol=0)


def test_functions_with_a_mode_or_another_result_are_not_recorded() -> None:
    graphs = FakeGraphs(lambda: [])
    recorder = recorded.Recorder(torch.device("cpu"), graphs=graphs)
    x = torch.ones(3)

    def with_mode(x: torch.Tensor, mode: object) -> torch.Tensor:
        return x * 2

    def gives_a_list(x: torch.Tensor) -> list[torch.Tensor]:
        return [x + 1]

    for _ in range(8):
        assert torch.equal(recorder.call("with_mode", with_mode, [x, Eval]), x * 2)
        assert recorder.call("gives_a_list", gives_a_list, [x])[0].tolist() == [2.0, 2.0, 2.0]
    report = recorder.report()
    assert report["with_mode"] == "not recorded: takes a Mode, whose random draws are counted in Python"
    assert report["gives_a_list"] == "not recorded: returns a list"
    assert graphs.captures == 1 and graphs.replays == 0  # gives_a_list was captured, then refused


def test_signatures_tell_calls_apart() -> None:
    x, y = torch.zeros(4, 2), torch.zeros(5, 2)
    assert recorded.signature([x, 3]) == recorded.signature([torch.ones(4, 2), 3])
    assert recorded.signature([x, 3]) != recorded.signature([y, 3])
    assert recorded.signature([x, 3]) != recorded.signature([x, 4])
    assert recorded.signature([x.double(), 3]) != recorded.signature([x, 3])
    assert recorded.signature([x], extra=(0, 8)) != recorded.signature([x], extra=(4, 8))
    assert recorded.signature([x, object()]) == "takes a value of type object"


def test_nothing_is_recorded_on_cpu_by_default() -> None:
    assert recorded.recorder_for("cpu") is None
    assert not recorded.may_record(torch.device("cpu"))
    prog = ss.load(README, devices="cpu")
    assert "RECORDABLE" not in prog.namespace
    assert recorded.for_program(prog.namespace, prog.namespace["train_step"]) is None
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m)
    assert opt.torch_opt.param_groups[0]["capturable"] is False  # cpu optimizers as before
    prog.train_step(m, opt, data([8])[0])
    assert "cpu" not in recorded.report()


def _enabled_with(env: dict[str, str]) -> list[bool]:
    code = ("import torch; from shapescript.runtime import recorded; "
            "print(recorded.enabled, recorded.may_record(torch.device('cuda:0')))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout.split()
    return [word == "True" for word in out]


def test_the_environment_can_turn_recording_off() -> None:
    environment = {k: v for k, v in os.environ.items() if k != recorded.RECORD_ENV}
    assert _enabled_with(environment) == [True, True]
    assert _enabled_with({**environment, recorded.RECORD_ENV: "off"}) == [False, False]


def test_a_workers_calls_go_through_the_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    """program_handlers._run, in this process, with a worker's module and a recorder on the CPU."""
    from types import SimpleNamespace

    from shapescript.parallel import program_handlers
    from shapescript.parallel.timeline import StepClock

    prog = ss.load(README, devices="cpu[0 1]")
    namespace: dict[str, Any] = {"__name__": "worker_module"}
    exec(compile(prog.worker_source, "worker", "exec"), namespace)
    namespace["RECORDABLE"] = table(README, devices="cuda[0 1]", target=Target.WORKER)
    spec = namespace["Mlp_spec"]
    m, ref = Model.init(spec, 0), Model.init(spec, 0)
    opt, ref_opt = ss.adamw(m, lr=1e-3), ss.adamw(ref, lr=1e-3)
    graphs = FakeGraphs(state_of(m, opt))
    monkeypatch.setitem(recorded._recorders, "cpu", recorded.Recorder(torch.device("cpu"), graphs=graphs))
    cpu = torch.device("cpu")
    # calls sent one at a time: no controller's verdict on a step before to wait for (WorkerState.take_verdict)
    state = SimpleNamespace(program=namespace, objects={1: m, 2: opt}, device=cpu, world=1, rank=0, clock=StepClock(cpu),
                            take_verdict=lambda: None)
    for batch in data([64] * 8):
        args = (("handle", 1), ("handle", 2), ("batch", "Digit", batch, {}))
        loss, draws = program_handlers._run(state, "train_step", args, (0, 64), True)
        want = namespace["train_step"](ref, ref_opt, Batch(namespace["Digit_spec"], batch))
        torch.testing.assert_close(loss, want.detach(), atol=1e-6, rtol=0)
        assert draws == []
    assert graphs.captures == 1 and graphs.replays == 8 - 1 - recorded.WARMUP
    torch.testing.assert_close(m.w1, ref.w1, atol=1e-6, rtol=0)


# -- the workers' agreement, over a real process group -------------------------------------------

CASES = [(True, True), (True, False), (False, True), (False, False)]


def _agree_worker(rank: int, path: str, out: Any) -> None:
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    try:
        out.put((rank, [recorded.agree_across_workers(oks[rank], torch.device("cpu"), "test") for oks in CASES]))
    finally:
        dist.destroy_process_group()


def test_workers_agree_only_if_every_one_captured(tmp_path: Any) -> None:
    context = mp.get_context("spawn")
    out = context.Queue()
    workers = [context.Process(target=_agree_worker, args=(rank, str(tmp_path / "store"), out)) for rank in range(2)]
    for w in workers:
        w.start()
    answers = dict(out.get(timeout=120) for _ in workers)
    for w in workers:
        w.join(timeout=30)
    assert answers == {0: [all(oks) for oks in CASES], 1: [all(oks) for oks in CASES]}


# -- on a GPU ------------------------------------------------------------------------------------

class CapturedGenerator:
    """torch's CUDA generator as a capture sees it: its state (a seed and an offset) goes into capture
    mode at capture_begin and out of it only at a capture_end that succeeds (CUDAGraph.cpp)."""

    def __init__(self, offset: int = 8) -> None:
        self.state = {"capturing": False, "offset": offset}

    def clone_state(self) -> CapturedGenerator:
        return CapturedGenerator(self.state["offset"])

    def graphsafe_set_state(self, other: CapturedGenerator) -> None:
        self.state = other.state


@pytest.mark.parametrize("fails", ["in the step", "at capture_end", "not"])
def test_a_failed_capture_gives_the_generator_back_its_state(fails: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CudaGraph.capture on a stand-in for torch.cuda: after a failed capture the device's generator
    is out of capture mode at its old offset; after one that succeeds it keeps the state the graph
    registered (a replay advances that one)."""
    generator = CapturedGenerator()
    registered = generator.state

    class Graph:
        def __init__(self, *args: Any, **kwargs: Any) -> None: ...

        def __enter__(self) -> None:
            generator.state["capturing"] = True

        def __exit__(self, *exc: object) -> None:
            if exc[0] is not None or fails == "at capture_end":  # cudaStreamEndCapture: invalidated
                raise RuntimeError("operation not permitted when stream is capturing")
            generator.state["capturing"] = False

    cuda = torch.cuda
    for name, value in [("graph", Graph), ("CUDAGraph", lambda: None), ("default_generators", (generator,)),
                        ("current_stream", lambda device=None: "stream"), ("set_stream", lambda stream: None),
                        ("device", lambda device: contextlib.nullcontext())]:
        monkeypatch.setattr(cuda, name, value)
    graph = recorded.CudaGraph(torch.device("cuda:0"), None)

    def step() -> str:
        if fails == "in the step":
            raise RuntimeError("operation not permitted when stream is capturing")
        return "out"

    if fails == "not":
        assert graph.capture(step) == "out"
        assert generator.state is registered and not registered["capturing"]
    else:
        with pytest.raises(RuntimeError, match="stream is capturing"):
            graph.capture(step)
        assert generator.state == {"capturing": False, "offset": 8}
        assert registered["capturing"]  # what torch leaves behind, no longer the generator's


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@needs_gpu
def test_a_cuda_graph_replays_new_inputs_and_a_failed_capture_leaves_the_stream() -> None:
    recorder = recorded.Recorder(torch.device("cuda:0"))
    w = torch.randn(5, 3, device="cuda:0")
    before = torch.cuda.current_stream()

    def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w)

    def syncs(x: torch.Tensor) -> torch.Tensor:
        return x * float(x.sum().item())  # waits for the device: no capture can hold it

    for _ in range(8):
        x = torch.randn(4, 5, device="cuda:0")  # after syncs' failed capture too
        torch.testing.assert_close(recorder.call("product", product, [x, w]), torch.relu(x @ w))
        rng = torch.cuda.get_rng_state("cuda:0")
        torch.testing.assert_close(recorder.call("syncs", syncs, [x]), x * float(x.sum()))
        # Neither a failed capture nor the eager call draws: the generator goes on where it was
        drawn = torch.randn(3, device="cuda:0")
        torch.cuda.set_rng_state(rng, "cuda:0")
        assert torch.equal(drawn, torch.randn(3, device="cuda:0"))
    assert recorder.report()["product"] == "recorded (replays 5)"
    assert recorder.report()["syncs"].startswith("not recorded: capture failed")
    assert torch.cuda.current_stream() == before


@needs_gpu
def test_readme_recorded_on_cuda0_matches_its_eager_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = recorded.recorder_for("cuda:0")
    assert recorder is not None, "recording is off (SHAPESCRIPT_RECORD)"
    prog = ss.load(README, devices="cuda[0]")
    losses, ref_losses, m, ref = recorded_and_eager(prog, ss.load(README, devices="cuda[0]"), [64] * 20 + [10])
    assert recorder.report()["train_step"].startswith("recorded (replays ")
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    torch.testing.assert_close(m.w1, ref.w1, atol=1e-5, rtol=0)
    torch.testing.assert_close(m.w2, ref.w2, atol=1e-5, rtol=0)
    assert losses[-2] < losses[0]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_readme_recorded_on_two_gpus_matches_one_device() -> None:
    prog = ss.load(README, devices="cuda[0 1]")
    one = ss.load(README, devices="cpu")
    try:
        m, ref = prog.Mlp.init(seed=0), one.Mlp.init(seed=0)
        opt, ref_opt = ss.adamw(m, lr=1e-3), ss.adamw(ref, lr=1e-3)
        for batch in data([64] * 20):
            prog.train_step(m, opt, batch)
            one.train_step(ref, ref_opt, batch)
        torch.testing.assert_close(m.w1, ref.w1, atol=1e-4, rtol=0)
        torch.testing.assert_close(m.w2, ref.w2, atol=1e-4, rtol=0)
        # A replayed step runs its collectives inside the graph: the workers' clocks see none of them
        steps = prog.timeline().steps
        assert steps and all(w.collectives for w in steps[0].workers)  # an eager warm-up
        assert all(not w.collectives for w in steps[-1].workers)  # a replay
    finally:
        prog.stop()
