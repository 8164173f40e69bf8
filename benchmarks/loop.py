"""The program's own loop against calling its step from Python, on one CPU device (issue 41, item 3's
CPU line: the loop within 5% of `train_step` on the same batches).

    python benchmarks/loop.py            # batch 64 and 6144, a few minutes
    python benchmarks/loop.py --quick    # a smoke run, not a figure

The README's MLP (examples/readme/mlp.ss) with AdamW, devices `cpu`, over a TensorDataset of k
batches. Three sides, whose blocks take turns (ABC..CBA, benchmarks/several.py's race), each on a
model of its own from the same init:
- the loop: `prog.run(m, opt, dataset, sink)`, the program's `for batch in data |> shuffle(seed=0)
  |> batches(B)`, writing each step's loss to a memory sink;
- the hand loop: what a user writes instead, a Python loop over the same dataset in the same order
  (the order `shuffle(seed=0)` documents: torch.randperm from a generator seeded with 0), each batch
  gathered with `t[idx]` and passed to `prog.train_step(m, opt, batch)`, its loss read as a float.
  The same batches as the loop's: their losses must agree, and the script checks that they do;
- `train_step` alone on batches drawn before its clock starts: no data work timed at all, where the
  loops gather a batch's shuffled rows from the whole dataset (at 6144 rows of 784 floats, 19 MiB
  from a dataset of 150 MiB, in random order: the cost of shuffling that a loop can't leave out).
Both loops are timed whole (shuffling and gathering in them), each step counting as its mean. The
figure is each side's median step; the 5% line is the loop against the hand loop, the same batches.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from several import LR, Batches, loop_data, loop_source, race, timed_steps  # noqa: E402  (benchmarks/several.py)

import shapescript as ss  # noqa: E402

Side = Callable[[int], list[tuple[float, float]]]


def program_loop(prog: Any, m: Any, opt: Any, dataset: Any, k: int) -> tuple[Side, Any]:
    """The program's loop, timed whole, and the memory sink its losses go to."""
    sink = ss.sinks.memory()

    def steps(n: int) -> list[tuple[float, float]]:
        t0 = time.perf_counter()
        prog.run(m, opt, dataset, sink)
        return [((time.perf_counter() - t0) / k, float("nan"))] * k
    return steps, sink


def hand_loop(prog: Any, m: Any, opt: Any, img: torch.Tensor, label: torch.Tensor, batch: int
              ) -> tuple[Side, list[float]]:
    """A Python loop calling `prog.train_step` on the loop's batches, timed whole, and its losses."""
    losses: list[float] = []

    def steps(n: int) -> list[tuple[float, float]]:
        t0 = time.perf_counter()
        order = torch.randperm(len(img), generator=torch.Generator().manual_seed(0))
        starts = range(0, len(img), batch)
        for start in starts:
            idx = order[start:start + batch]
            losses.append(float(prog.train_step(m, opt, {"img": img[idx], "label": label[idx]})))
        return [((time.perf_counter() - t0) / len(starts), float("nan"))] * len(starts)
    return steps, losses


def measure(batch: int, k: int, blocks: int) -> tuple[float, float, float, float]:
    """Median step of `train_step` alone, of the hand loop and of the program's loop, in seconds, and
    the largest difference between the two loops' losses over their first pass."""
    prog = ss.load(loop_source(batch), devices="cpu", name="mlp.ss")
    models = [prog.Mlp.init(seed=0) for _ in range(3)]
    opts = [ss.adamw(m, lr=LR) for m in models]
    img, label = loop_data(batch, k)
    hand, hand_losses = hand_loop(prog, models[1], opts[1], img, label, batch)
    loop, sink = program_loop(prog, models[2], opts[2], ss.TensorDataset(img=img, label=label), k)
    sides = [timed_steps(prog, models[0], opts[0], Batches(batch)), hand, loop]
    times, _, _ = race(sides, warmup=1, blocks=blocks, size=k)
    apart = max(abs(a - r["loss"]) for a, r in zip(hand_losses[:k], sink.records[:k]))
    step, by_hand, by_loop = (statistics.median(t) for t in times)
    return step, by_hand, by_loop, apart


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions: a smoke run, not a measurement")
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| batch | train_step alone | hand loop | the program's loop | loop / hand loop | loop / step alone "
          "| losses apart |")
    print("|---|---|---|---|---|---|---|")
    for batch, k in ((64, 50), (6144, 8)):
        step, hand, loop, apart = measure(batch, 4 if args.quick else k, 2 if args.quick else 8)
        print(f"| {batch} | {step * 1e3:.3f} ms | {hand * 1e3:.3f} ms | {loop * 1e3:.3f} ms | {loop / hand:.3f} "
              f"| {loop / step:.3f} | {apart:.1e} |")
        if apart > 1e-5:
            sys.exit(f"the loops' losses differ by {apart:.2e}: they aren't on the same batches")


if __name__ == "__main__":
    main()
