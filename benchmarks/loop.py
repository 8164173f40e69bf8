"""The program's own loop against calling its step from Python, on one CPU device (issue 41, item 3's
CPU line: the loop within 5% of `train_step` on the same batches).

    python benchmarks/loop.py            # batch 64 and 6144, a few minutes
    python benchmarks/loop.py --quick    # a smoke run, not a figure

The README's MLP (examples/readme/mlp.ss) with AdamW, devices `cpu`. Two sides, whose blocks take
turns (ABBA, benchmarks/several.py's race):
- `train_step`: `prog.train_step(m, opt, batch)` from Python, each batch drawn before its clock
  starts (the reference: no data work timed at all);
- the loop: `prog.run(m, opt, dataset, sink)`, the program's `for batch in data |> shuffle(seed=0)
  |> batches(B)` over a TensorDataset of the same k batches, writing each step's loss to a memory
  sink; the whole loop is timed, its shuffling and batch gathering in it, and each step counts as
  its mean.
The figure is each side's median step and the loop's ratio to `train_step`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from several import LR, Batches, loop_source, race, timed_loop, timed_steps  # noqa: E402  (benchmarks/several.py)

import shapescript as ss  # noqa: E402


def measure(batch: int, k: int, blocks: int) -> tuple[float, float]:
    """Median step of `train_step` and of the loop, in seconds."""
    prog = ss.load(loop_source(batch), devices="cpu", name="mlp.ss")
    m_step, m_loop = prog.Mlp.init(seed=0), prog.Mlp.init(seed=0)
    sides = [timed_steps(prog, m_step, ss.adamw(m_step, lr=LR), Batches(batch)),
             timed_loop(prog, m_loop, ss.adamw(m_loop, lr=LR), batch, k)]
    times, _, _ = race(sides, warmup=1, blocks=blocks, size=k)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions: a smoke run, not a measurement")
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| batch | train_step | the program's loop | loop / step |")
    print("|---|---|---|---|")
    for batch, k in ((64, 50), (6144, 8)):
        step, loop = measure(batch, 4 if args.quick else k, 2 if args.quick else 8)
        print(f"| {batch} | {step * 1e3:.3f} ms | {loop * 1e3:.3f} ms | {loop / step:.3f} |")


if __name__ == "__main__":
    main()
