"""The cost of checking a batch passed from Python (issue 15, item 1): the short way a right batch
takes (runtime/data.py's `as_given`) against the full check, side by side in one run.

    python benchmarks/arg_checks.py

For the README's MLP with small dims (D = 12, Hd = 32, C = 5) at batch 64 on one device: the
argument checks of `prog.train_step(m, opt, {"img": x, "label": y})` (everything a call does before
the program's code runs) and the whole call, with the short way and without it (the full check
alone), alternating, each the median of many repetitions.
"""

from __future__ import annotations

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
from common import cpu_model  # noqa: E402  (benchmarks/common.py)

import shapescript as ss  # noqa: E402
from shapescript.runtime import data  # noqa: E402

ROUNDS, CALLS = 15, 2000


def per_call(fn: Callable[[], object]) -> float:
    """Microseconds a call, over CALLS calls."""
    began = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - began) / CALLS * 1e6


def main() -> None:
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dims replace the file's, which load() says
        prog = ss.load(ROOT / "examples" / "readme" / "mlp.ss", devices="cpu", dims={"D": 12, "Hd": 32, "C": 5})
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    g = torch.Generator().manual_seed(0)
    batch = {"img": torch.randn(64, 12, generator=g), "label": torch.randint(0, 5, (64,), generator=g)}
    step = prog.train_step
    checks = lambda: step._checked_args((m, opt, batch), {})  # noqa: E731
    call = lambda: step(m, opt, batch)  # noqa: E731
    short = data.as_given
    full_only: Callable[..., None] = lambda *args: None  # noqa: E731
    figures: dict[tuple[str, str], list[float]] = {}
    for fn in (checks, call):  # warm up
        for _ in range(200):
            fn()
    for _ in range(ROUNDS):
        for way, hook in (("short", short), ("full", full_only), ("full", full_only), ("short", short)):
            data.as_given = hook  # type: ignore[assignment]
            for name, fn in (("checks", checks), ("call", call)):
                figures.setdefault((name, way), []).append(per_call(fn))
    data.as_given = short
    print(f"machine: {cpu_model()}, {platform.system()}, torch {torch.__version__}, 1 thread")
    for name, what in (("checks", "argument checks"), ("call", "whole call of train_step")):
        a = statistics.median(figures[(name, "short")])
        b = statistics.median(figures[(name, "full")])
        print(f"{what:26s} short way {a:7.1f} us   full check {b:7.1f} us   ratio {a / b:.2f}")


if __name__ == "__main__":
    main()
