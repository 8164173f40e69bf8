"""The cost of checking the arguments of a call from Python: the function's own
short way (runtime/guards.py's `signature_check`, made at its first call), the guards' short way
without it (the earlier way: runtime/data.py's `as_given` in each batch guard) and the full check alone,
side by side in one run.

    python benchmarks/arg_checks.py

For the README's MLP with small dims (D = 12, Hd = 32, C = 5) at batch 64 on one device: the
argument checks of `prog.train_step(m, opt, {"img": x, "label": y})` (everything a call does before
the program's code runs) and the whole call, each way in turn, each figure the median of many
repetitions: in wall time, and in this thread's CPU time (on a shared machine, wall time also counts
whatever else ran on the core meanwhile).
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from common import cpu_model  # noqa: E402  (benchmarks/common.py)

import shapescript as ss  # noqa: E402
from shapescript.api import Function  # noqa: E402
from shapescript.runtime import data, guards  # noqa: E402

ROUNDS = 25
CALLS = {"checks": 2000, "call": 300}  # per figure: the checks alone are short, a whole call is not
WAYS = ("signature", "guards", "full")


def per_call(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """Microseconds a call, over `calls` calls: in wall time, and in this thread's CPU time."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - wall) / calls * 1e6, (time.thread_time() - cpu) / calls * 1e6


@contextmanager
def checked_by(step: Function, way: str) -> Iterator[None]:
    """Calls of `step` take `way` through their checks: the function's short way (as shipped), the
    guards' own short way only, or the full check only."""
    signature, as_given = step._quick, data.as_given
    if way != "signature":
        step._quick = None
    if way == "full":
        data.as_given = guards.as_given = lambda *args: None  # type: ignore[assignment]
    try:
        yield
    finally:
        step._quick = signature
        data.as_given = guards.as_given = as_given  # type: ignore[assignment]


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
    tasks = {"checks": lambda: step._checked_args((m, opt, batch), {}), "call": lambda: step(m, opt, batch)}
    for fn in tasks.values():  # warm up (the first call makes the short way)
        for _ in range(200):
            fn()
    assert step._quick is not None, "train_step has no short way through its checks"
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for k in range(ROUNDS):
        for way in WAYS if k % 2 == 0 else WAYS[::-1]:  # alternating, so no way always goes first
            with checked_by(step, way):
                for name, fn in tasks.items():
                    figures.setdefault((name, way), []).append(per_call(fn, CALLS[name]))
    print(f"machine: {cpu_model()}, {platform.system()}, torch {torch.__version__}, 1 thread")
    print("medians; the function's short way (signature), the guards' own (the earlier way), the full check")
    for name, what in (("checks", "argument checks"), ("call", "whole call of train_step")):
        for clock, kind in ((0, "wall"), (1, "CPU")):
            med = {way: statistics.median(f[clock] for f in figures[(name, way)]) for way in WAYS}
            print(f"{what:26s} {kind:4s} signature {med['signature']:7.1f} us   guards {med['guards']:7.1f} us   "
                  f"full {med['full']:7.1f} us   signature/guards {med['signature'] / med['guards']:.2f}   "
                  f"signature/full {med['signature'] / med['full']:.2f}")


if __name__ == "__main__":
    main()
