"""`ss.load(..., compiled=...)`: each pure function on the device compiled by torch.compile with its
generic axes dynamic: a training loop over batches of several sizes traces its loss (forward and
backward) once, with no graph break and no recompile, and equals the eager program; the update
stays eager (a `mut` function isn't compiled)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import shapescript as ss

MLP = "examples/readme/mlp.ss"


def batches(sizes: tuple[int, ...]) -> Iterator[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    for n in sizes:
        yield {"img": torch.randn(n, 784, generator=g), "label": torch.randint(0, 10, (n,), generator=g)}


def train_both(backend: str, sizes: tuple[int, ...]) -> tuple[ss.Program, list[tuple[float, float]], float]:
    """The README's MLP trained on `sizes`' batches, compiled and eager: each step's two losses, and
    the largest difference of their params at the end."""
    compiled = ss.load(MLP, devices="cpu", compiled=backend)
    eager = ss.load(MLP, devices="cpu")
    m, e = compiled.Mlp.init(seed=0), eager.Mlp.init(seed=0)
    m_opt, e_opt = ss.adamw(m, lr=1e-3), ss.adamw(e, lr=1e-3)
    losses = [(float(compiled.train_step(m, m_opt, b)), float(eager.train_step(e, e_opt, b))) for b in batches(sizes)]
    theirs = e.state_dict()
    return compiled, losses, max(float((v - theirs[k]).abs().max()) for k, v in m.state_dict().items())


def test_a_loop_traces_its_loss_once_whatever_the_batch_size() -> None:
    torch._dynamo.reset()
    counters.clear()
    prog, losses, params = train_both("aot_eager", (64, 64, 17, 64, 5))
    assert sorted(prog.compiled) == ["forward", "loss"]  # train_step updates its model: eager
    assert counters["stats"]["unique_graphs"] == 1, counters["stats"]  # loss's, with forward inside
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["calls_captured"] >= 3
    for got, want in losses:
        assert got == pytest.approx(want, abs=1e-5)
    assert params < 1e-5
    assert prog.compile_report()["loss"] is not None and prog.compile_report()["forward"] is None


def test_compiled_steps_refuse_several_devices() -> None:
    with pytest.raises(ValueError, match="one device"):
        ss.load(MLP, devices="cpu[0 1]", compiled=True)


@pytest.mark.slow
def test_inductor_equals_eager() -> None:
    """As the loop above, compiled to C++ by inductor. Most of its time is torch's, whatever the
    program, once a process: inductor's check of the CPU's vector instructions (10 test compiles,
    about 15 s on 2 cores) and its precompiled header (5 s); each of the MLP's 5 kernels then takes
    about 1 s. (programs.LINEAR, with 2 kernels, took as long.)"""
    torch._dynamo.reset()
    counters.clear()
    prog, losses, params = train_both("inductor", (32, 32, 7))
    assert counters["stats"]["unique_graphs"] == 1, counters["stats"]  # no recompile for the batch of 7
    assert not counters["graph_break"], dict(counters["graph_break"])
    for got, want in losses:
        assert got == pytest.approx(want, abs=1e-5)
    assert params < 1e-5
    assert prog.compile_report()["loss"] is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_compiled_steps_compose_with_recorded_steps() -> None:
    """On a GPU a compiled program's train_step is still recorded: its compiled loss runs eagerly
    through the warm-up (compiling once), then the whole step, compiled kernels and eager update, is
    captured as one CUDA graph and replayed, computing what the eager, unrecorded program computes.
    (aot_eager keeps this test to seconds; benchmarks/gpu_gpt.py times inductor's kernels recorded.)"""
    from recorded_support import recorded_and_eager

    from shapescript.runtime import recorded
    recorder = recorded.recorder_for("cuda:0")
    assert recorder is not None, "recording is off (SHAPESCRIPT_RECORD)"
    torch._dynamo.reset()
    counters.clear()
    prog = ss.load(MLP, devices="cuda[0]", compiled="aot_eager")
    losses, ref_losses, m, ref = recorded_and_eager(prog, ss.load(MLP, devices="cuda[0]"), [64] * 12 + [10])
    assert recorder.report()["train_step"].startswith("recorded (replays "), recorder.report()
    assert counters["stats"]["unique_graphs"] == 1, counters["stats"]  # the last batch of 10: no recompile
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(m.state_dict()[name], value, atol=1e-5, rtol=0)
