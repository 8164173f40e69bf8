"""What the tests of recorded steps (runtime/recorded.py) share: tests/runtime/test_recorded.py and
test_recorded_loop.py read the RECORDABLE table of a built module, and run the recorder on the CPU
with a stand-in for CUDA graphs, on README batches."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import torch

import shapescript as ss
from shapescript.runtime import recorded


def table(source: str, **build: Any) -> tuple[str, ...] | None:
    """The RECORDABLE table of the module `ss.build` prints, None where it has none."""
    lines = [line for line in ss.build(source, **build).splitlines() if line.startswith("RECORDABLE = ")]
    if not lines:
        return None
    assert len(lines) == 1
    return ast.literal_eval(lines[0].split("=", 1)[1].split("#")[0].strip())  # type: ignore[no-any-return]


class FakeGraphs:
    """Makes stand-ins for CUDA graphs on the CPU. Capture runs the step and then puts back every
    tensor of `state()` (the model's params, the optimizer's state), so that, as with a real capture,
    nothing has changed; it keeps the call, and `settings()` at that time. Replay runs the kept call
    on the recorder's buffers and refills the captured outputs in place; it refuses settings that
    changed since the capture (a real graph would go on with the old learning rate)."""

    def __init__(self, state: Callable[[], list[torch.Tensor]], settings: Callable[[], Any] = lambda: None,
                 fail: Exception | None = None) -> None:
        self.state, self.settings, self.fail = state, settings, fail
        self.captures = 0
        self.replays = 0

    def __call__(self, device: torch.device, stream: object) -> FakeGraph:
        assert stream is None  # no side stream off cuda
        return FakeGraph(self)


class FakeGraph:
    def __init__(self, maker: FakeGraphs) -> None:
        self.maker = maker
        self.run: Callable[[], Any] | None = None
        self.outputs: Any = None
        self.settings: Any = None

    def capture(self, run: Callable[[], Any]) -> Any:
        self.maker.captures += 1
        if self.maker.fail is not None:
            raise self.maker.fail
        before = [t.detach().clone() for t in self.maker.state()]
        self.outputs = run()
        with torch.no_grad():
            for t, was in zip(self.maker.state(), before):
                t.copy_(was)
        self.run, self.settings = run, self.maker.settings()
        return self.outputs

    def replay(self) -> None:
        assert self.run is not None
        assert self.maker.settings() == self.settings, "replayed a graph captured with other settings"
        self.maker.replays += 1
        fresh = self.run()
        with torch.no_grad():
            for out, new in zip(recorded.output_tensors(self.outputs), recorded.output_tensors(fresh)):
                out.copy_(new)


def state_of(m: Any, opt: Any) -> Callable[[], list[torch.Tensor]]:
    """Every tensor a step of `m` and `opt` changes: its params and the optimizer's state."""
    def tensors() -> list[torch.Tensor]:
        held = [t for per_param in opt.torch_opt.state.values() for t in per_param.values()
                if isinstance(t, torch.Tensor)]
        return [*m.params(), *held]
    return tensors


def data(sizes: list[int], seed: int = 5) -> list[dict[str, torch.Tensor]]:
    """README batches, each different: labels from a fixed linear teacher."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(784, 10, generator=g)
    out = []
    for n in sizes:
        x = torch.randn(n, 784, generator=g)
        out.append({"img": x, "label": (x @ teacher).argmax(dim=1)})
    return out


def recorded_and_eager(prog: Any, eager: Any, sizes: list[int]) -> tuple[list[float], list[float], Any, Any]:
    """The README's train_step on data(sizes), from the same init, by `prog` (recorded where its device
    records) and by `eager` with its RECORDABLE table taken away (its calls run as they would without
    recording): each side's losses, then each side's model."""
    eager.namespace.pop("RECORDABLE")
    m, ref = prog.Mlp.init(seed=0), eager.Mlp.init(seed=0)
    opt, ref_opt = ss.adamw(m, lr=1e-3), ss.adamw(ref, lr=1e-3)
    losses, ref_losses = [], []
    for batch in data(sizes):
        losses.append(float(prog.train_step(m, opt, batch)))
        ref_losses.append(float(eager.train_step(ref, ref_opt, batch)))
    return losses, ref_losses, m, ref
