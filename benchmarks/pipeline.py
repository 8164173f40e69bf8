"""Pipelined steps: the program's own loop on several devices with each step sent
before the answer to the one before it is read, against waiting for every answer
(SHAPESCRIPT_PIPELINE=off), side by side in one run.

    python benchmarks/pipeline.py                      # cpu[0 1], README MLP, batches of 64 and 6144
    python benchmarks/pipeline.py --devices 'cpu[0 1 2]' --rounds 10

The README's MLP (examples/readme/mlp.ss) on --devices, `prog.run(m, opt, dataset, sink)` over a
TensorDataset the workers keep (sent once, before the timing), into a memory sink. Each round times
one pass with the pipeline on and one with it off, in alternating order (ABBA); the figures are the
medians of the per-step times over the rounds, and the ratio the median of the rounds' ratios. The
losses both ways are compared too: they must be equal.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import shapescript as ss  # noqa: E402
from shapescript.parallel.pipeline import PIPELINE_ENV  # noqa: E402

MLP = (ROOT / "examples" / "readme" / "mlp.ss").read_text()


def one_pass(prog: ss.api.Program, m: object, opt: object, data: ss.TensorDataset, mode: str) -> tuple[float, list]:
    os.environ[PIPELINE_ENV] = mode
    sink = ss.sinks.memory()
    start = time.perf_counter()
    prog.run(m, opt, data, sink)
    return time.perf_counter() - start, [r["loss"] for r in sink.records]


def race(devices: str, batch: int, steps: int, rounds: int) -> None:
    prog = ss.load(MLP.replace("batches(64)", f"batches({batch})"), devices=devices, name="mlp.ss")
    try:
        g = torch.Generator().manual_seed(0)
        n = batch * steps
        data = ss.TensorDataset(img=torch.randn(n, 784, generator=g), label=torch.randint(0, 10, (n,), generator=g))
        models = {mode: prog.Mlp.init(seed=0) for mode in ("on", "off")}
        opts = {mode: ss.adamw(m, lr=1e-3) for mode, m in models.items()}
        times: dict[str, list[float]] = {"on": [], "off": []}
        for mode in ("on", "off"):  # warm up: the dataset sent, the workers' first steps
            one_pass(prog, models[mode], opts[mode], data, mode)
        for r in range(rounds):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")
            losses = {}
            for mode in order:
                seconds, losses[mode] = one_pass(prog, models[mode], opts[mode], data, mode)
                times[mode].append(seconds / steps)
            assert losses["on"] == losses["off"], "the pipelined loop computed something else"
        on, off = statistics.median(times["on"]), statistics.median(times["off"])
        ratio = statistics.median(a / b for a, b in zip(times["on"], times["off"]))
        print(f"| {batch:>5} | {on * 1e3:8.3f} ms | {off * 1e3:8.3f} ms | {on / off:.3f} | {ratio:.3f} |", flush=True)
    finally:
        os.environ.pop(PIPELINE_ENV, None)
        prog.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="cpu[0 1]")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="a smoke test: 2 rounds, fewer steps")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{args.devices}, {rounds} rounds")
    print("| batch | pipelined step | waiting step | ratio of medians | pair ratio |")
    print("|------:|---------------:|-------------:|-----------------:|-----------:|")
    race(args.devices, 64, 20 if args.quick else 100, rounds)
    race(args.devices, 6144, 3 if args.quick else 10, rounds)


if __name__ == "__main__":
    main()
