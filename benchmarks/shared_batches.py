"""Batches from Python through shared memory against the pipes, side by side.

    python benchmarks/shared_batches.py                 # cpu[0 1], batch 6144: about a minute
    python benchmarks/shared_batches.py --quick         # a smoke test

The README's MLP (examples/readme/mlp.ss) on --devices (default 'cpu[0 1]'), AdamW lr = 1e-3, at
--batch (default 6144: 18.4 MiB of images and labels). In one pool, blocks of steps take turns:

- shared: `prog.train_step(m, opt, {"img": x, "label": y})` from Python, each worker's rows of the
  images through shared memory (parallel/shared.py), the labels (48 KiB) through the pipes;
- pipes: the same call with shared memory off (`shared.enabled = False`), as before: each worker's
  rows pickled through its pipe;
- loop: the program's own loop, `prog.run(m, opt, dataset, sink)`, over a TensorDataset of as many
  batches that the workers keep (sent once), each step sending only the indices of each worker's
  part (benchmarks/several.py's timed_loop); only the whole loop is timed, each step its mean.

Each call is timed in the controller around it; each side's figure is the median over its steps,
and the ratios the median of the rounds' ratios. Also the call that only reads a batch
(`fn rows(batch: [b] Digit) -> [b] = sum(batch.img, over=D)`), shared against pipes, as
docs/benchmarks.md's "Several devices" measures it.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch  # noqa: E402
from common import cpu_model  # noqa: E402  (benchmarks/common.py)
from several import Batches, loop_source, timed_loop  # noqa: E402

import shapescript as ss  # noqa: E402
from shapescript.parallel import shared  # noqa: E402

Steps = Callable[[int], list[float]]


def from_python(prog: Any, m: Any, opt: Any, batch: int, share: bool) -> Steps:
    """k calls of `prog.train_step` from Python on fresh batches (drawn outside the timing)."""
    data = Batches(batch)

    def steps(k: int) -> list[float]:
        out = []
        for _ in range(k):
            x, y = data.next()
            shared.enabled = share
            t0 = time.perf_counter()
            float(prog.train_step(m, opt, {"img": x, "label": y}))
            out.append(time.perf_counter() - t0)
        return out
    return steps


def only_reads(prog: Any, batch: int, share: bool) -> Steps:
    x, y = Batches(batch).next()

    def calls(k: int) -> list[float]:
        out = []
        for _ in range(k):
            shared.enabled = share
            t0 = time.perf_counter()
            prog.rows({"img": x, "label": y})
            out.append(time.perf_counter() - t0)
        return out
    return calls


def race(sides: dict[str, Steps], warmup: int, rounds: int, block: int) -> dict[str, list[list[float]]]:
    """Each side's blocks, taking turns (ABC, then CBA), after a warmup block each."""
    for run in sides.values():
        run(warmup)
    times: dict[str, list[list[float]]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(sides[name](block))
    return times


def report(times: dict[str, list[list[float]]], against: str) -> None:
    base = [statistics.median(t) for t in times[against]]
    for name, blocks in times.items():
        median = statistics.median(t for b in blocks for t in b)
        ratio = statistics.median(statistics.median(b) / a for b, a in zip(blocks, base))
        print(f"  {name:<7} {median * 1e3:8.2f} ms a step   ({ratio:.2f} of {against}'s)", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="cpu[0 1]")
    ap.add_argument("--batch", type=int, default=6144)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rounds, block = (2, 3) if args.quick else (6, 5)
    torch.set_num_threads(1)
    print(f"{cpu_model()}, {platform.python_version()}, torch {torch.__version__}; {args.devices}, batch "
          f"{args.batch}; shared memory from {shared.THRESHOLD // 1024} KiB a field", flush=True)

    source = loop_source(args.batch) + "\nfn rows(batch: [b] Digit) -> [b] = sum(batch.img, over=D)\n"
    prog = ss.load(source, devices=args.devices, name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        sides = {"shared": from_python(prog, m, opt, args.batch, True),
                 "pipes": from_python(prog, m, opt, args.batch, False)}
        loop = timed_loop(prog, m, opt, args.batch, block)
        sides["loop"] = lambda k: [t for t, _ in loop(k)]
        print(f"prog.train_step from Python, {rounds} rounds of {block} steps a side, median:", flush=True)
        report(race(sides, block, rounds, block), "pipes")

        reading = {"shared": only_reads(prog, args.batch, True), "pipes": only_reads(prog, args.batch, False)}
        print("a call that only reads the batch, median:", flush=True)
        report(race(reading, 5, rounds, 4 * block), "pipes")
    finally:
        shared.enabled = True
        prog.stop()


if __name__ == "__main__":
    main()
