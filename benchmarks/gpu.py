"""ShapeScript on the GPUs present against torch DDP (NCCL) and eager PyTorch: the chapter's MGPU-7 table.

    python benchmarks/gpu.py                  # every GPU present: a few minutes, most of it starting processes
    python benchmarks/gpu.py --quick          # a smoke run, not a figure
    python benchmarks/gpu.py --gpus 2         # the first 2 GPUs only (1: the one-GPU comparison)
    python benchmarks/gpu.py --out table.md   # the table also written to a file
    python benchmarks/gpu.py --quick --on-cpu --gpus 2   # the same sides on cpu[0 1] (Gloo): checks the script

Without a CUDA device it says so in one line and exits 0 (unless --on-cpu).

The model: examples/readme/mlp.ss (D = 784, Hd = 256, C = 10), AdamW with lr = 1e-3, at batch 64
and 6144. The sides:

On two GPUs or more (devices cuda[0 .. n-1]; the chapter's figures are from cuda[0 1 2]):
- ShapeScript, the program's own loop `prog.run(m, opt, data, sink)` (the README's, its batch size
  set) over a TensorDataset, which the workers keep on their GPUs and gather from, and over
  HostDigits (benchmarks/common.py), which each worker loads on the CPU, a batch at a time through
  __getitems__, and copies to its GPU; each with recorded steps and without;
- DDP (the reference): torch.nn.parallel.DistributedDataParallel in as many spawned ranks, NCCL
  (benchmarks/several.py's ranks), each rank's part of the batch moved to its GPU before its clock
  starts (its data on the GPUs, as DDP's usual measurement); loss, backward, AdamW step, synchronized.
On one GPU (ShapeScript's cuda[0] runs in this process):
- eager PyTorch (the reference: benchmarks/step.py's hand-written model), and DDP with one rank,
  their batches already on the GPU;
- ShapeScript, `prog.train_step(m, opt, batch)` with the batch on the GPU, and the program's loop
  over a TensorDataset on the GPU, each recorded and not; the loop over HostDigits.

Recorded steps (CUDA graphs) are switched by the environment variable SHAPESCRIPT_RECORD (on|off),
which a process reads once, when it starts (runtime/recorded.py): on several GPUs each program's
workers start with the variable set to its side's value; on one GPU, where a program runs in the
process that loads it, the ShapeScript sides of each value run in a spawned process of their own,
driven over a pipe (their steps timed there, as DDP's in its ranks). So the recorded and the
unrecorded sides run side by side in one run.

Every side runs blocks of steps back to back, as a training loop does; the blocks take turns (ABC..CBA)
after a warmup (several.py's race), and the sides that draw batches draw the same sequence from the
same weights (their first losses are compared). A figure is the median step (a loop's step: its
block's mean); the ratio is against the reference, the pair ratio the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from common import HostDigits, cpu_model  # noqa: E402  (benchmarks/common.py)
from several import LR, PROGRAM, Batches, DdpRanks, loop_source, race, rank_threads, synced, timed_steps  # noqa: E402

NO_GPU = "no CUDA device: nothing to measure"
RECORD = "SHAPESCRIPT_RECORD"
Steps = Callable[[int], list[tuple[float, float]]]


@contextmanager
def recording(value: str) -> Iterator[None]:
    """SHAPESCRIPT_RECORD set to `value` inside, as it was after."""
    before = os.environ.get(RECORD)
    os.environ[RECORD] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(RECORD, None)
        else:
            os.environ[RECORD] = before


def under(value: str, steps: Steps) -> Steps:
    """`steps` run with SHAPESCRIPT_RECORD set to `value`."""
    def run(k: int) -> list[tuple[float, float]]:
        with recording(value):
            return steps(k)
    return run


class OnDevice:
    """several.Batches's sequence, each batch moved to `device` as it is drawn (outside the timing)."""

    def __init__(self, batch: int, device: torch.device) -> None:
        self.batches, self.device = Batches(batch), device

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.batches.next()
        return x.to(self.device), y.to(self.device)


def digits(batch: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k batches of several.Batches's sequence, as one dataset's images and labels."""
    data = Batches(batch)
    xs, ys = zip(*(data.next() for _ in range(k)))
    return torch.cat(xs), torch.cat(ys)


def loop_steps(prog: Any, m: Any, opt: Any, dataset: Any, k: int) -> Steps:
    """The program's own loop over `dataset` of k batches: k steps, each counted as the loop's mean
    (loss NaN: the loop's batches are shuffled, not the other sides')."""
    import shapescript as ss
    sink = ss.sinks.memory()

    def steps(n: int) -> list[tuple[float, float]]:
        assert n == k, (n, k)
        t0 = time.perf_counter()
        prog.run(m, opt, dataset, sink)
        if prog.device.type == "cuda":  # on one device the loop's last step may still be queued
            torch.cuda.synchronize()
        return [((time.perf_counter() - t0) / k, math.nan)] * k
    return steps


def eager_steps(w1: torch.Tensor, w2: torch.Tensor, batch: int, device: torch.device) -> Steps:
    """benchmarks/step.py's hand-written model and AdamW on `device`, each batch already there."""
    from step import Hand
    hand, data = Hand(w1.to(device), w2.to(device)), OnDevice(batch, device)
    step = synced(hand.step, device.type)

    def steps(k: int) -> list[tuple[float, float]]:
        out = []
        for _ in range(k):
            x, y = data.next()
            t0 = time.perf_counter()
            loss = step(x, y)
            out.append((time.perf_counter() - t0, float(loss)))
        return out
    return steps


def several_gpus(ss: Any, ddp: DdpRanks, kind: str, indices: tuple[int, ...], batch: int, k: int
                 ) -> tuple[dict[str, Steps], list[Any]]:
    """The sides on cuda[indices] (kind "cpu": cpu[indices], to check the script), DDP first; and the
    programs, to stop after."""
    devices = f"{kind}[{' '.join(map(str, indices))}]"
    x, y = digits(batch, k)
    datasets = {"TensorDataset kept on the GPUs": ss.TensorDataset(img=x, label=y),
                "HostDigits loaded from the CPU": HostDigits(x, y)}
    sides: dict[str, Steps] = {"DDP (NCCL, data on the GPUs)" if kind == "cuda" else "DDP (Gloo)": ddp.steps("ddp")}
    programs = []
    for value in ("on", "off"):
        with recording(value):  # the workers start with the variable set
            prog = ss.load(loop_source(batch), devices=devices, name=f"mlp.ss with batches({batch})")
            programs.append(prog)
            for label, data in datasets.items():
                m = prog.Mlp.init(seed=0)
                sides[f"ShapeScript loop, {label}, recorded {value}"] = under(
                    value, loop_steps(prog, m, ss.adamw(m, lr=LR), data, k))
            if value == "on":
                ddp.setup(batch, m.w1, m.w2, prog.worker_source)  # the same initial weights (RemoteModel reads)
    return sides, programs


def one_device_sides(ss: Any, kind: str, batch: int, k: int, record: str) -> dict[str, Steps]:
    """The ShapeScript sides on one device (cuda:0; kind "cpu": the CPU), in a process whose
    SHAPESCRIPT_RECORD is `record`."""
    device = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    x, y = digits(batch, k)
    prog = ss.load(loop_source(batch), devices="cuda[0]" if kind == "cuda" else "cpu",
                   name=f"mlp.ss with batches({batch})")
    datasets = {"TensorDataset on the GPU": ss.TensorDataset(img=x.to(device), label=y.to(device))}
    if record == "on":
        datasets["HostDigits loaded from the CPU"] = HostDigits(x, y)
    m = prog.Mlp.init(seed=0)
    sides = {f"ShapeScript prog.train_step, recorded {record}":
             timed_steps(prog, m, ss.adamw(m, lr=LR), OnDevice(batch, device))}
    for label, data in datasets.items():
        ml = prog.Mlp.init(seed=0)
        sides[f"ShapeScript loop, {label}, recorded {record}"] = loop_steps(prog, ml, ss.adamw(ml, lr=LR), data, k)
    return sides


def side_process(conn: Any, kind: str, batch: int, k: int, record: str) -> None:
    """A spawned process for the one-device sides: runtime/recorded.py reads SHAPESCRIPT_RECORD once
    a process, so each value needs its own. Answers the sides' labels, then ("steps", label, n) with
    n steps' [(time, loss)] (a failure: its text), until ("stop",)."""
    os.environ[RECORD] = record  # before shapescript is imported (this module imports it in main only)
    import shapescript as ss
    try:
        sides = one_device_sides(ss, kind, batch, k, record)
        conn.send(list(sides))
    except Exception as e:
        conn.send(f"{type(e).__name__}: {e}")
        return
    while (msg := conn.recv())[0] != "stop":
        try:
            conn.send(sides[msg[1]](msg[2]))
        except Exception as e:
            conn.send(f"{type(e).__name__}: {e}")


class SideProcess:
    """side_process as the controller drives it; `stop()` ends it."""

    def __init__(self, kind: str, batch: int, k: int, record: str) -> None:
        import multiprocessing as mp
        ours, theirs = mp.get_context("spawn").Pipe()
        with recording(record):
            self.proc = mp.get_context("spawn").Process(target=side_process, args=(theirs, kind, batch, k, record),
                                                        daemon=True)
            self.proc.start()
        theirs.close()
        self.conn = ours
        answer = ours.recv()
        self.labels: list[str] = answer if isinstance(answer, list) else []
        self.failure = answer if isinstance(answer, str) else None

    def steps(self, label: str) -> Steps:
        def run(n: int) -> list[tuple[float, float]]:
            self.conn.send(("steps", label, n))
            answer = self.conn.recv()
            if isinstance(answer, str):
                raise RuntimeError(answer)
            return answer
        return run

    def stop(self) -> None:
        if self.proc.is_alive():
            self.conn.send(("stop",))
            self.proc.join(30)


def one_gpu(ss: Any, ddp: DdpRanks, kind: str, batch: int, k: int) -> tuple[dict[str, Steps], list[Any]]:
    """The sides on cuda:0 (kind "cpu": the CPU, to check the script), eager PyTorch first; and the
    processes, to stop after."""
    device = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    m = ss.load(PROGRAM, devices="cuda[0]" if kind == "cuda" else "cpu").Mlp.init(seed=0)  # the sides' first weights
    sides: dict[str, Steps] = {"eager PyTorch": eager_steps(m.w1.detach(), m.w2.detach(), batch, device)}
    # DdpRanks builds the generated code of a program on workers as well: any two-device build of the
    # program gives it (compiled only: no worker starts, no second GPU needed)
    ddp.setup(batch, m.w1.detach().cpu(), m.w2.detach().cpu(), ss.load(PROGRAM, devices=f"{kind}[0 1]").worker_source)
    sides[f"DDP, one rank ({'NCCL' if kind == 'cuda' else 'Gloo'})"] = ddp.steps("ddp")
    processes = [SideProcess(kind, batch, k, record) for record in ("on", "off")]
    for process in processes:
        if process.failure is not None:
            print(f"batch {batch}: the one-device sides of a process failed to start: {process.failure}", flush=True)
        for label in process.labels:
            sides[label] = process.steps(label)
    return sides, processes


def table(figures: dict[str, dict[int, tuple[float, float, float]]], batches: list[int], reference: str) -> str:
    """The markdown table: for each side and batch, the median step, its ratio to the reference's
    and the pair ratio."""
    head = "| side | " + " | ".join(f"batch {b} | / {reference} | pair ratio" for b in batches) + " |"
    rule = "|:--|" + "--:|--:|--:|" * len(batches)
    rows = []
    for label, by_batch in figures.items():
        cells = []
        for b in batches:
            if b in by_batch:
                median, ratio, pair = by_batch[b]
                cells.append(f"{median * 1e3:.3f} ms | {ratio:.3f} | {pair:.3f}")
            else:
                cells.append("failed | | ")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions: a smoke run, not a measurement")
    ap.add_argument("--gpus", type=int, default=None, help="use the first N GPUs (default: all of them)")
    ap.add_argument("--out", type=Path, default=None, help="also write the machine line and the table here")
    ap.add_argument("--on-cpu", action="store_true",
                    help="the same sides on CPU devices (Gloo), --gpus of them: checks that the script runs")
    args = ap.parse_args(argv)
    kind = "cpu" if args.on_cpu else "cuda"
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if present == 0 and not args.on_cpu:
        print(NO_GPU + f" (torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA") + ")")
        return 0
    count = (present if not args.on_cpu else 2) if args.gpus is None else args.gpus
    if not 1 <= count <= (present if not args.on_cpu else os.cpu_count() or 1):
        ap.error(f"--gpus {count}: this machine has {present} GPU(s)")
    indices = tuple(range(count))
    import shapescript as ss

    gpus = ", ".join(f"cuda:{i} {torch.cuda.get_device_name(i)}" if kind == "cuda" else f"cpu:{i}" for i in indices)
    machine = (f"machine: {gpus}; {cpu_model()}, {os.cpu_count()} cores; torch {torch.__version__} (CUDA "
               f"{torch.version.cuda}); python {platform.python_version()}; {RECORD} before the run: "
               f"{os.environ.get(RECORD, 'unset')}")
    print(machine, flush=True)
    reference = "DDP" if count > 1 else "eager"
    ddp = DdpRanks(rank_threads(kind, count), kind, indices)
    # (batch, warmup rounds, rounds, steps a block)
    plan = [(64, 1, 3, 5), (6144, 1, 2, 3)] if args.quick else [(64, 2, 40, 20), (6144, 1, 25, 10)]
    figures: dict[str, dict[int, tuple[float, float, float]]] = {}
    notes = []
    try:
        for batch, warmup, rounds, size in plan:
            sides, programs = (several_gpus(ss, ddp, kind, indices, batch, size) if count > 1
                               else one_gpu(ss, ddp, kind, batch, size))
            try:
                working = {}
                for label, steps in sides.items():  # a side that can't run is reported and left out
                    try:
                        steps(size)
                        working[label] = steps
                    except Exception as e:
                        notes.append(f"batch {batch}: {label} failed: {type(e).__name__}: {str(e).splitlines()[0]}")
                        print(notes[-1], flush=True)
                times, medians, worst = race(list(working.values()), warmup, rounds, size)
            finally:
                for prog in programs:  # programs, or one device's side processes
                    prog.stop()
            ref = statistics.median(times[0])
            for k, (label, ts) in enumerate(zip(working, times)):
                pair = statistics.median(r[k] / r[0] for r in medians)
                figures.setdefault(label, {})[batch] = (statistics.median(ts), statistics.median(ts) / ref, pair)
            for label in sides:
                figures.setdefault(label, {})
            notes.append(f"batch {batch}: {rounds} rounds of {size}-step blocks a side after {warmup} warmup round(s); "
                         f"the first 3 losses of the sides that draw batches agree to {worst:.1e}")
            print(notes[-1], flush=True)
    finally:
        ddp.stop()
    text = table(figures, [batch for batch, *_ in plan], reference)
    print(text)
    if args.out is not None:
        args.out.write_text("\n".join([machine, *notes, "", text, ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
