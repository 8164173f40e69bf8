"""ShapeScript against hand-written PyTorch: one training step of the README's MLP, and compile time.

    python benchmarks/step.py            # what `make bench` runs (under a minute on 2 cores)
    python benchmarks/step.py --quick    # a few seconds, for a smoke test

The step: examples/readme/mlp.ss loaded with devices='cpu' (D = 784, Hd = 256, C = 10), AdamW with
lr = 1e-3, called from Python as `prog.train_step(m, opt, {"img": x, "label": y})`, against the same
model written by hand (two param tensors, relu MLP, F.cross_entropy, torch.optim.AdamW,
backward/step/zero_grad) twice: with torch's default AdamW, as people write it, and with
`fused=True`, the kernel ShapeScript's AdamW runs on cpu (so that ratio is the call path's cost
alone). All start from the same weights, see the same batch, and run with the same
torch.set_num_threads. Their steps take turns, the order rotating every repetition so none always
goes first, after a warmup; each figure is the median of many repetitions. Each ratio is
ShapeScript / that PyTorch side.

Compile time: shapescript.api.compile_program (parse and check) + shapescript.pipeline.python_module
(the typed IR, then Python source) of the README program, torch already imported: the median of repeats in
this process, and the median over a few fresh processes of their first compile.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import cpu_model  # noqa: E402  (benchmarks/common.py)

import shapescript as ss  # noqa: E402
from shapescript.api import compile_program  # noqa: E402
from shapescript.pipeline import python_module  # noqa: E402

PROGRAM = ROOT / "examples" / "readme" / "mlp.ss"
D, HD, C = 784, 256, 10
SMALL = (12, 32, 5)  # D, Hd, C of the small MLP
LR = 1e-3


class Hand:
    """The README's model written directly in PyTorch."""

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor, fused: bool | None = None) -> None:
        self.w1 = w1.detach().clone().requires_grad_(True)
        self.w2 = w2.detach().clone().requires_grad_(True)
        self.opt = torch.optim.AdamW([self.w1, self.w2], lr=LR, fused=fused)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(torch.relu(x @ self.w1) @ self.w2, y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss.detach()


def time_steps(batch: int, warmup: int, reps: int, generated: bool = False,
               dims: tuple[int, int, int] = (D, HD, C)) -> tuple[float, list[tuple[float, float]]]:
    """The median ShapeScript step, and for each PyTorch side (default AdamW, fused AdamW) its
    median step and the median of the per-repetition ratios ShapeScript / it; seconds.

    `generated`: call the generated Python function directly with a ready ss.Batch, skipping what
    `prog.train_step` does first (checking the arguments): the cost of the generated code alone.
    `dims`: D, Hd and C of the MLP (the README's by default).
    """
    d, _, c = dims
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # other dims than the file's, which load() says
        prog = ss.load(PROGRAM, devices="cpu", dims=dict(zip(("D", "Hd", "C"), dims)))
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=LR)
    hands = [Hand(m.w1, m.w2), Hand(m.w1, m.w2, fused=True)]
    g = torch.Generator().manual_seed(batch)
    teacher = torch.randn(d, c, generator=g)
    if generated:
        raw, spec = prog.namespace["train_step"], prog.Digit

        def train_step(m: ss.Model, opt: ss.Optimizer, data: dict) -> torch.Tensor:
            return raw(m, opt, ss.Batch(spec, data))
    else:
        train_step = prog.train_step

    def fresh() -> tuple[torch.Tensor, torch.Tensor]:
        # A new batch for every round of steps, drawn outside the timing: "images" in [0, 1] and
        # labels from a fixed random linear teacher, so there is something to learn and the loss
        # falls as in real training, but no batch is seen twice.
        x = torch.rand(batch, d, generator=g)
        return x, ((x - 0.5) @ teacher).argmax(1)

    def ss_step(x: torch.Tensor, y: torch.Tensor) -> float:
        data = {"img": x, "label": y}
        t0 = time.perf_counter()
        train_step(m, opt, data)
        return time.perf_counter() - t0

    def hand_step(hand: Hand) -> Callable[[torch.Tensor, torch.Tensor], float]:
        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            t0 = time.perf_counter()
            hand.step(x, y)
            return time.perf_counter() - t0
        return step

    sides = [ss_step, *map(hand_step, hands)]
    for _ in range(warmup):
        x, y = fresh()
        for side in sides:
            side(x, y)
    times: list[list[float]] = [[] for _ in sides]
    for i in range(reps):
        x, y = fresh()
        for k in range(len(sides)):  # rotate who goes first
            which = (i + k) % len(sides)
            times[which].append(sides[which](x, y))
    ours = times[0]
    return statistics.median(ours), [(statistics.median(theirs), statistics.median(a / b for a, b in zip(ours, theirs)))
                                     for theirs in times[1:]]


def show(batch: int, reps: int, ours: float, theirs: list[tuple[float, float]], note: str = "") -> None:
    (plain, plain_pair), (fused, fused_pair) = theirs
    print(f"{batch:>6}  {ours * 1e3:>9.3f} ms  {plain * 1e3:>9.3f} ms  {ours / plain:>6.3f}  {plain_pair:>6.3f}"
          f"  {fused * 1e3:>9.3f} ms  {ours / fused:>6.3f}  {fused_pair:>6.3f}  {reps}{note}", flush=True)


_COLD = """
import sys, time
sys.path.insert(0, {root!r})
import torch
from shapescript.api import compile_program
from shapescript.pipeline import python_module
source = open({program!r}).read()
t0 = time.perf_counter()
python_module(compile_program(source, {program!r}, "cpu"))
print(time.perf_counter() - t0)
"""


def time_compile(reps: int, processes: int) -> tuple[float, float]:
    """(median first compile in a fresh process, median of `reps` compiles in this one), seconds.

    The first compile of a process also pays for what the checker and sympy load lazily; it is
    timed in `processes` fresh interpreters, after their imports, so torch's import is excluded.
    """
    import subprocess

    source = PROGRAM.read_text()
    code = _COLD.format(root=str(ROOT), program=str(PROGRAM))
    firsts = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                   text=True).stdout) for _ in range(processes)]

    def once() -> float:
        t0 = time.perf_counter()
        python_module(compile_program(source, str(PROGRAM), "cpu"))
        return time.perf_counter() - t0

    once()
    return statistics.median(firsts), statistics.median(once() for _ in range(reps))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions: a smoke test, not a measurement")
    ap.add_argument("--keep-subnormals", action="store_true",
                    help="don't flush subnormal floats to zero (see docs/benchmarks.md)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the generated code alone (a ready batch, no argument checks)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads for both sides (default: torch's own default)")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    # AdamW's first moments of dead ReLU units decay geometrically through the subnormal floats,
    # whose arithmetic is many times slower on x86; after some hundred steps that stall swamps a
    # small batch's step (1 ms -> 2 ms at batch 64 on our machine), equally on both sides. We
    # measure the step, not the FPU's subnormal path: flush them to zero, on both sides alike.
    flush = not args.keep_subnormals and torch.set_flush_denormal(True)

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; torch {torch.__version__}, "
          f"{threads} thread{'s' if threads != 1 else ''}; python {platform.python_version()}; subnormals "
          f"{'flushed to zero' if flush else 'kept'}")
    # (batch, warmup, repetitions): each side runs warmup + repetitions steps
    plan = [(64, 20, 100), (6144, 3, 10)] if args.quick else [(64, 200, 2000), (6144, 10, 200)]
    print("ratio: ShapeScript / that side; pair: the median of the per-step ratios")
    print(f"{'batch':>6}  {'ShapeScript':>12}  {'PyTorch':>12}  {'ratio':>6}  {'pair':>6}"
          f"  {'fused AdamW':>12}  {'ratio':>6}  {'pair':>6}  steps")
    for batch, warmup, reps in plan:
        show(batch, reps, *time_steps(batch, warmup, reps))
    # A small model, whose step is short enough that what a call costs before the generated code
    # runs shows: the README's MLP with D = 12, Hd = 32, C = 5.
    small_warmup, small_reps = (50, 500) if args.quick else (500, 5000)
    show(64, small_reps, *time_steps(64, small_warmup, small_reps, dims=SMALL),
         note=f"  (the {'-'.join(map(str, SMALL))} MLP)")
    if args.breakdown:
        print("the generated code alone, given a ready batch (no argument checks):")
        for batch, warmup, reps in plan:
            show(batch, reps, *time_steps(batch, warmup, reps, generated=True))
    first, median = time_compile(5 if args.quick else 50, 1 if args.quick else 5)
    print(f"compile (check + lower) of {PROGRAM.relative_to(ROOT)}: {median * 1e3:.2f} ms median; "
          f"{first * 1e3:.2f} ms the first time in a fresh process (after importing torch and shapescript)")


if __name__ == "__main__":
    main()
