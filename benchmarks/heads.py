"""`split H` against the same step on one device: the attention example's train_step, time and memory.

    python benchmarks/heads.py            # cpu[0 1]: a few minutes on 2 cores
    python benchmarks/heads.py --quick    # about a minute (mostly starting workers): a smoke test

The model: examples/attention/gpt.ss with D = 256, H = 8, Dh = 32, F = 1024, L = 2, T = 64 and V =
the characters of examples/attention/corpus.txt (given as `dims=`), big enough that the heads' work
(q, k, v, the scores [b H T T]) weighs in a step. AdamW, lr = 3e-3, `ss.Eval` (dropout is the
identity), `prog.train_step(m, opt, {"tokens": ..., "targets": ...}, ss.Eval)` from Python, on
windows of the corpus (the same sequence for every side). The sides, raced in blocks of steps taking
turns (ABC, then CBA) after a warmup, with benchmarks/several.py's `race`:

- one device: the program on `cpu`, in this process, twice: with one torch thread (the reference of
  every ratio) and with as many as the cores this process may use (what one device gets on a quiet
  machine; on a busy one torch's threads wait for each other at every op, see docs/benchmarks.md);
- `split H` on --devices (default 'cpu[0 1]': two workers, one torch thread each on 2 cores): each
  worker holds H / N heads of q, k, v, the scores and the attention's output, and w_o's rows of its
  heads; w_qkv and the other params are whole on every worker (H comes after 3 in w_qkv's
  `(3 H Dh)`), and the partial sums of `... @ m.w_o` are added up by an all-reduce;
- `split H` and `shard params` together: the params without H in pieces as well.

The first 3 losses of each split side must agree with one device's within 1e-4 (the script stops
otherwise: a race between two different computations is worthless).

Memory: each worker's from `prog.memory()` (shapescript/parallel/memory.py's `Meter` around every
step: /proc/self/clear_refs, then VmHWM), and one device's measured by the same `Meter` around each
of its steps in this process (whose RSS also holds the controller's share of the other sides: a few
MiB). For each: the RSS before the model was made, the last timed step's peak, that peak over
"before" and over the step's own start, the largest step peak, and the params and AdamW state that
the process holds (its pieces, by storage). Each configuration starts fresh workers.

On one machine's CPUs the workers share the cores that one device uses alone, so split H can't be
faster here: the ratio shows what it costs (the all-reduces of the partial sums, the controller's
messages, the extra processes) and the memory what each worker keeps (1/N of the split values).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from attention import CORPUS, PROGRAM, corpus_ids  # noqa: E402  (benchmarks/attention.py)
from common import cpu_model  # noqa: E402  (benchmarks/common.py)
from several import cpu_devices, quantiles, race, rank_threads, timed_steps  # noqa: E402
from sharded import LOSS_TOLERANCE, Memory, shapescript_memory  # noqa: E402

import shapescript as ss  # noqa: E402
from shapescript.parallel.memory import Meter  # noqa: E402
from shapescript.parallel.program_handlers import own_bytes  # noqa: E402

DIMS = {"D": 256, "H": 8, "Dh": 32, "F": 1024, "L": 2, "T": 64}
LR = 3e-3
SPLIT_SIDES = {"split H": ("split H",), "split H + shard params": ("split H", "shard params")}


class TextBatches:
    """The same fresh batches of windows of the corpus for every side: tokens and their successors,
    from a generator seeded with the batch size."""

    def __init__(self, ids: torch.Tensor, batch: int) -> None:
        self.ids, self.batch = ids, batch
        self.g = torch.Generator().manual_seed(batch)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        T = DIMS["T"]
        starts = torch.randint(0, len(self.ids) - T - 1, (self.batch,), generator=self.g)
        rows = self.ids[starts[:, None] + torch.arange(T + 1)]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def with_options(options: tuple[str, ...]) -> str:
    """gpt.ss under a devices line with `options` (the devices it is loaded on replace the line's)."""
    if not options:
        return PROGRAM.read_text()
    return "devices cpu\n" + "".join(f"    {o}\n" for o in options) + PROGRAM.read_text()


def load(options: tuple[str, ...], devices: str, V: int) -> Any:
    """The program with this benchmark's dims, without the warning that they replace the declared ones."""
    name = f"gpt.ss ({', '.join(options) or 'one device'})"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*sizes given when loading replace", category=UserWarning)
        return ss.load(with_options(options), devices=devices, dims={"V": V, **DIMS}, name=name)


class OneDevice:
    """The one-device side in this process with `threads` torch threads (set around each step, since
    two such sides take turns), its steps measured by a Meter as a worker measures its calls."""

    def __init__(self, V: int, ids: torch.Tensor, batch: int, threads: int) -> None:
        self.threads = threads
        self.prog = load((), "cpu", V)
        self.meter = Meter(torch.device("cpu"))
        self.before_model = self.meter.now()
        self.m = self.prog.Gpt.init(seed=0)
        self.opt = ss.adamw(self.m, lr=LR)
        self.steps = timed_steps(self, self.m, self.opt, TextBatches(ids, batch), ("tokens", "targets"), (ss.Eval,))

    @property
    def device(self) -> torch.device:
        return self.prog.device

    def train_step(self, *args: Any) -> Any:
        torch.set_num_threads(self.threads)
        with self.meter.measuring("train_step on cpu"):
            return self.prog.train_step(*args)

    def memory(self) -> Memory:
        last, largest = self.meter.last, self.meter.largest
        assert last is not None and largest is not None, "asked after a block of steps"
        held = (own_bytes(self.m) or 0) + (own_bytes(self.opt) or 0)
        return Memory(self.before_model, last.peak, last.added, largest.peak, held)


def one_configuration(devices: str, V: int, ids: torch.Tensor, batch: int, warmup: int, blocks: int,
                      size: int) -> None:
    """Race one device (one torch thread, then every core's), split H and both options at `batch`,
    and print their figures; the ratios are against one device with one thread."""
    cores = len(os.sched_getaffinity(0))
    ones = {f"one device, {n} thread{'s' if n > 1 else ''}": OneDevice(V, ids, batch, n) for n in sorted({1, cores})}
    progs = {label: load(options, devices, V) for label, options in SPLIT_SIDES.items()}
    try:
        sides = {label: one.steps for label, one in ones.items()}
        before = {}
        for label, prog in progs.items():
            prog.workers()
            before[label] = [w.now for w in prog.memory()]  # workers started, the program loaded, no model
            m = prog.Gpt.init(seed=0)
            sides[label] = timed_steps(prog, m, ss.adamw(m, lr=LR), TextBatches(ids, batch), ("tokens", "targets"),
                                       (ss.Eval,))
        times, rounds, worst = race(list(sides.values()), warmup, blocks, size)
        memory = {label: [one.memory()] for label, one in ones.items()} | {
            label: shapescript_memory(prog, before[label]) for label, prog in progs.items()}
    finally:
        for prog in progs.values():
            prog.stop()
    alone = statistics.median(times[0])
    print(f"batch {batch}: {blocks} blocks of {size} steps a side after {warmup} round(s) of warmup; "
          f"{'median':>10}  {'/ 1 thread':>10}  {'pair ratio':>10}")
    for k, (label, ts) in enumerate(zip(sides, times)):
        pair = statistics.median(r[k] / r[0] for r in rounds)
        print(f"  {label:<28} {statistics.median(ts) * 1e3:>9.1f} ms  {statistics.median(ts) / alone:>10.3f}  "
              f"{pair:>10.3f}  ({quantiles(ts)})")
    # RSS, MiB, as benchmarks/sharded.py prints it: before the model; the last step's peak, that over
    # "before" and over its own start; the largest step peak; the params' and AdamW state's bytes held
    print(f"  memory per process, MiB {'':10} {'before':>8} {'peak':>10} {'- before':>9} {'- start':>8} "
          f"{'largest':>9} {'held':>8}")
    for label, figures in memory.items():
        for rank, f in enumerate(figures):
            print(f"    {label:<28} {rank} {f.line()}")
    print(f"  the first 3 losses of each split side and one device's agree to {worst:.1e}", flush=True)
    if not worst <= LOSS_TOLERANCE:
        sys.exit(f"the first losses differ by {worst:.1e} > {LOSS_TOLERANCE}: the sides don't compute the same step")


def commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions: a smoke test, not a measurement")
    ap.add_argument("--devices", default="cpu[0 1]", help="CPU devices as a devices line lists them (default cpu[0 1])")
    args = ap.parse_args(argv)
    device_set = cpu_devices(ap, args.devices, divides=DIMS["H"])
    world, devices = device_set.count, str(device_set)
    ids, V = corpus_ids()
    print(f"gpt.ss ({CORPUS.name}: V = {V}) with {', '.join(f'{k} = {v}' for k, v in DIMS.items())}; AdamW lr {LR}, "
          f"Eval; one device in this process; {devices}: {world} workers, {rank_threads('cpu', world)} thread(s) each")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; torch {torch.__version__}; "
          f"python {platform.python_version()}; {datetime.datetime.now():%Y-%m-%d %H:%M}; commit {commit()}")
    # (batch, warmup rounds, blocks a side, steps a block)
    plan = [(8, 1, 3, 2), (32, 1, 2, 2)] if args.quick else [(8, 1, 8, 3), (32, 1, 5, 2)]
    for batch, warmup, blocks, size in plan:
        one_configuration(devices, V, ids, batch, warmup, blocks, size)


if __name__ == "__main__":
    main()
