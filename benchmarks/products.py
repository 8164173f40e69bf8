"""oneDNN's matrix products against torch's default (MKL's) on this CPU, side by side in one run
(runtime/products.py, which picks one of the two for each product of `@`).

    python benchmarks/products.py            # about three minutes on 2 cores
    python benchmarks/products.py --quick    # a smoke test, not a figure

1. The products alone: for each layer shape below, at several row counts, a layer's three products
   (the product A[m k] @ B[k n], A's gradient G @ B^T, B's gradient A^T @ G) through torch's `@`
   and through oneDNN's linear kernel, as runtime/products.py calls it; medians on one thread and on
   all the cores, the ratio torch / oneDNN (above 1: oneDNN quicker), and which one the rule picks.
2. The README MLP on one device, `prog.train_step(m, opt, batch)` at batch 64 and 6144, with the
   products' switch (`products.ENABLED`, read at every product) on and off in turns, in one process
   with all its torch threads.
3. The README MLP on cpu[0 1], the program's own loop over a TensorDataset the workers keep
   (benchmarks/several.py's timed_loop), at 6144 and 64: two pools, started with
   SHAPESCRIPT_MATMUL=onednn and =torch, their blocks in turns.

Each ratio in 2 and 3 is on / off, and the pair ratio the median of the rounds' ratios.
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
from common import cpu_model  # noqa: E402  (benchmarks/common.py)
from several import loop_source, timed_loop  # noqa: E402

import shapescript as ss  # noqa: E402
from shapescript.runtime import products  # noqa: E402

PROGRAM = ROOT / "examples" / "readme" / "mlp.ss"
# (k, n) of a layer: the README MLP's two, the 12-32-5 MLP's first, and a transformer's MLP
LAYERS = [(784, 256), (256, 10), (12, 32), (512, 2048), (2048, 512)]
ROWS = [64, 256, 3072, 6144]


def median_time(f: Callable[[], Any], budget: float) -> float:
    f()
    times: list[float] = []
    end = time.perf_counter() + budget
    while time.perf_counter() < end or len(times) < 5:
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def products_table(threads: int, budget: float) -> None:
    torch.set_num_threads(threads)
    print(f"\n1. products on {threads} thread(s): median µs through torch (MKL) / oneDNN (ratio); * the rule's pick")
    print(f"  {'m':>5} {'k':>5} {'n':>5}   {'A @ B':>22}   {'G @ B^T (A grad)':>22}   {'A^T @ G (B grad)':>22}")
    for k, n in LAYERS:
        for m in ROWS:
            a, b, g = torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)
            sides = [
                (lambda: a @ b, lambda: products._onednn(a, b), products.onednn_for(m, k, n)),
                (lambda: g @ b.t(), lambda: products._onednn(g, b.t()), products.onednn_for(m, n, k)),
                (lambda: a.t() @ g, lambda: products.onednn_weight_grad(a, g), products.onednn_for_weight_grad(m, k, n)),
            ]
            cells = []
            for mkl, dnn, picked in sides:
                t_mkl, t_dnn = median_time(mkl, budget), median_time(dnn, budget)
                mark = "*" if picked else " "
                cells.append(f"{t_mkl * 1e6:7.0f} /{t_dnn * 1e6:7.0f} ({t_mkl / t_dnn:4.2f}){mark}")
            print(f"  {m:>5} {k:>5} {n:>5}   " + "   ".join(cells), flush=True)


def one_device(batches: list[int], rounds: int, steps: int) -> None:
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    enabled = products.ENABLED  # put back after the race
    prog = ss.load(PROGRAM, devices="cpu")
    print(f"\n2. README MLP, devices='cpu', {torch.get_num_threads()} threads: prog.train_step, oneDNN's "
          f"products on / off ({rounds} rounds of {steps} steps a side)")
    for batch in batches:
        x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
        models = {side: prog.Mlp.init(seed=0) for side in (True, False)}
        opts = {side: ss.adamw(models[side], lr=1e-3) for side in models}

        def block(side: bool) -> float:
            products.ENABLED = side
            t0 = time.perf_counter()
            for _ in range(steps):
                prog.train_step(models[side], opts[side], {"img": x, "label": y})
            return (time.perf_counter() - t0) / steps
        report(batch, block, rounds)
    products.ENABLED = enabled


def several(batches: list[int], rounds: int, size: int) -> None:
    print(f"\n3. README MLP on cpu[0 1]: the program's loop over a kept TensorDataset, SHAPESCRIPT_MATMUL="
          f"onednn / torch ({rounds} rounds of {size} steps a side)")
    torch.set_num_threads(1)
    for batch in batches:
        loops: dict[bool, Callable[[int], Any]] = {}
        progs = []
        for side in (True, False):
            os.environ[products.ENV] = "onednn" if side else "torch"  # read by the workers as they start
            prog = ss.load(loop_source(batch), devices="cpu[0 1]", name=f"mlp.ss {'onednn' if side else 'torch'}")
            m = prog.Mlp.init(seed=0)
            loops[side] = timed_loop(prog, m, ss.adamw(m, lr=1e-3), batch, size)
            loops[side](size)  # the workers start, the dataset is sent
            progs.append(prog)
        os.environ.pop(products.ENV)
        report(batch, lambda side: loops[side](size)[0][0], rounds)
        for prog in progs:
            prog.stop()


def report(batch: int, block: Callable[[bool], float], rounds: int) -> None:
    for side in (True, False, False, True):  # warmup
        block(side)
    times: dict[bool, list[float]] = {True: [], False: []}
    ratios = []
    for r in range(rounds):
        got = {side: block(side) for side in ((True, False) if r % 2 == 0 else (False, True))}
        for side, t in got.items():
            times[side].append(t)
        ratios.append(got[True] / got[False])
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"  batch {batch:>5}: oneDNN {on * 1e3:8.3f} ms, torch {off * 1e3:8.3f} ms, ratio {on / off:.3f}, "
          f"pair ratio {statistics.median(ratios):.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if products._LINEAR is None:
        sys.exit("this torch has no oneDNN linear kernel here: nothing to compare")
    cores = len(os.sched_getaffinity(0))
    print(f"machine: {cpu_model()} ({products.vendor() or 'vendor unknown'}), {cores} cores; torch {torch.__version__}; "
          f"python {platform.python_version()}; the rule is {'on' if products.ENABLED else 'off'} here by default")
    budget = 0.02 if args.quick else 0.15
    for threads in sorted({1, cores}):
        products_table(threads, budget)
    one_device([64, 6144], 3 if args.quick else 20, 3 if args.quick else 10)
    several([6144, 64], 3 if args.quick else 30, 2 if args.quick else 5)


if __name__ == "__main__":
    main()
