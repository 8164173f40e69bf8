"""The gradients' all-reduce during the backward pass (runtime/collectives.py's
BucketedAverage) against after it (SHAPESCRIPT_OVERLAP=off), side by side in one run.

    python benchmarks/overlap.py                        # cpu[0 1], about a minute
    python benchmarks/overlap.py --bucket-mb 0.01       # smaller buckets: several for the README's MLP
    python benchmarks/overlap.py --devices 'cuda[0 1]'  # where it matters

The README's MLP (examples/readme/mlp.ss) on --devices, AdamW with lr = 1e-3, at batch 64 and 6144:
`prog.train_step(m, opt, {"img": x, "label": y})` from Python. Two copies of the program are loaded
at once, each with its own workers, one started with overlap on and one with it off (the workers read
SHAPESCRIPT_OVERLAP as they start); only one runs at a time. Blocks of STEPS steps take turns (on,
off, off, on) after a warmup; each figure is the median of the blocks' mean step, and the ratio is
on / off. The README's gradient (813,072 bytes) fits in the first bucket (1 MiB, DDP's), which can
only be sent once the whole backward is done: with the default caps the two sides should take the
same time, and --bucket-mb below 0.8 splits it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from common import cpu_model  # noqa: E402  (benchmarks/common.py)

import shapescript as ss  # noqa: E402
from shapescript.runtime import collectives  # noqa: E402

PROGRAM = ROOT / "examples" / "readme" / "mlp.ss"
ROUNDS, STEPS, WARMUP = 5, 8, 3


def load(devices: str, overlap: bool, bucket_mb: str | None) -> tuple[object, object, object]:
    """The program on its own workers, started with overlap on or off; its model and optimizer."""
    os.environ[collectives.OVERLAP_ENV] = "on" if overlap else "off"
    if bucket_mb is not None:
        os.environ[collectives.BUCKET_ENV] = bucket_mb
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = ss.load(PROGRAM, devices=devices)
    m = prog.Mlp.init(seed=0)
    return prog, m, ss.adamw(m, lr=1e-3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default="cpu[0 1]")
    ap.add_argument("--bucket-mb", default=None, help="SHAPESCRIPT_BUCKET_MB for both sides (default 25)")
    args = ap.parse_args()
    sides = {"on": load(args.devices, True, args.bucket_mb), "off": load(args.devices, False, args.bucket_mb)}
    g = torch.Generator().manual_seed(0)
    print(f"machine: {cpu_model()}, {platform.system()}, torch {torch.__version__}, {args.devices}, "
          f"bucket cap {args.bucket_mb or '25'} MB")
    for size in (64, 6144):
        batches = [{"img": torch.randn(size, 784, generator=g), "label": torch.randint(0, 10, (size,), generator=g)}
                   for _ in range(STEPS)]
        times: dict[str, list[float]] = {"on": [], "off": []}
        for side in sides.values():
            prog, m, opt = side
            for b in batches[:WARMUP]:
                prog.train_step(m, opt, b)  # type: ignore[attr-defined]
        for _ in range(ROUNDS):
            for name in ("on", "off", "off", "on"):
                prog, m, opt = sides[name]
                began = time.perf_counter()
                for b in batches:
                    prog.train_step(m, opt, b)  # type: ignore[attr-defined]
                times[name].append((time.perf_counter() - began) / STEPS * 1e3)
        on, off = statistics.median(times["on"]), statistics.median(times["off"])
        print(f"batch {size:5d}: overlap on {on:8.2f} ms/step   off {off:8.2f} ms/step   ratio {on / off:.3f}")
    for prog, _, _ in sides.values():
        prog.stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
