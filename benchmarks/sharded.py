"""ShapeScript's `shard params` against torch FSDP2 (`fully_shard`): step time and memory per worker.

    python benchmarks/sharded.py            # cpu[0 1]: a few minutes on 2 cores
    python benchmarks/sharded.py --quick    # 1-3 minutes (mostly starting processes): a smoke test

The model: examples/readme/mlp.ss with `shard params` under its devices line, loaded on --devices
(default 'cpu[0 1]': two worker processes, Gloo) as it is (D = 784, Hd = 256, C = 10) and with
Hd = 4096 (`dims=`), where the params and AdamW's state weigh more than the batch. AdamW, lr = 1e-3.
Against it, the same model written by hand as two layers of one param each, `fully_shard` on each
layer and then on the root (FSDP2: each param cut along its first dim, all-gathered before a layer's
forward and again before its backward, its gradient reduce-scattered), torch.optim.AdamW with the
same settings, on as many spawned processes (Gloo over the loopback: GLOO_SOCKET_IFNAME=lo,
MASTER_ADDR=127.0.0.1, a FileStore in a temporary folder), each taking its part of each batch as the
workers take theirs. Both start from the program's initial weights (`prog.Mlp.init(seed=0)`, sent
whole to the ranks) and see the same batches (benchmarks/several.py's `Batches`); every process runs
as many torch threads as the workers do (one each on 2 cores for cpu[0 1]). The sides, raced in
blocks of steps taking turns (ABC, then CBA) after a warmup, as benchmarks/several.py races them:

- ShapeScript, `prog.train_step(m, opt, {"img": x, "label": y})` from Python, timed in the
  controller: it includes sending each worker its part of the batch through the pipes;
- ShapeScript, the program's own loop `prog.run(m, opt, dataset, sink)` over a TensorDataset that
  the workers keep, so no batch goes through the pipes (each step counts as its block's mean);
- FSDP2: loss, backward, AdamW step, timed inside the ranks after a barrier (the slower rank's time).

The first 3 losses of `prog.train_step` and of FSDP2 must agree within 1e-4 (the script stops
otherwise: a race between two different computations is worthless).

Memory per worker, measured alike on both sides with shapescript/parallel/memory.py's `Meter`
(/proc/self/clear_refs and VmHWM around every step): the resident memory before the model was made,
the peak of the last timed step, the largest step peak, and the bytes of params and AdamW state
that the process holds (its pieces). Each configuration starts fresh processes on both sides, so
no side keeps the memory of an earlier one.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Only torch and benchmarks/ here: the FSDP2 ranks are spawned processes that import this file.
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import cpu_model  # noqa: E402  (benchmarks/common.py)
from several import (  # noqa: E402
    Batches,
    DdpRanks,
    cpu_devices,
    loop_source,
    quantiles,
    race,
    rank_threads,
    shares,
    timed_loop,
    timed_steps,
)

LR = 1e-3
LOSS_TOLERANCE = 1e-4
MIB = 2**20


def sharded(source: str) -> str:
    """The program with `shard params` under its devices line (the devices it is loaded on replace
    the line; the option stays)."""
    line = next(text for text in source.splitlines() if text.startswith("devices "))
    return source.replace(line, f"{line}\n    shard params", 1)


# -- the FSDP2 side: one spawned process per rank, driven over a pipe by several.py's DdpRanks --------

class Layer(torch.nn.Module):
    """One param, `x @ w`: a module of its own, so that FSDP2 gathers and frees it by itself."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


class Mlp(torch.nn.Module):
    def __init__(self, w1: torch.Tensor, w2: torch.Tensor) -> None:
        super().__init__()
        self.l1, self.l2 = Layer(w1), Layer(w2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)))


def local_bytes(t: torch.Tensor) -> int:
    """What a tensor takes in this process: a DTensor's own piece, or the tensor."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def fsdp_rank(rank: int, store_path: str, conn: Any, threads: int, kind: str, indices: tuple[int, ...]) -> None:
    """An FSDP2 rank of len(indices) on the CPU (a spawned process; ddp_rank's arguments, so that
    DdpRanks spawns it). ("setup", batch, w1, w2, _) builds the sharded model and its AdamW;
    ("steps", "fsdp", k) runs k timed steps, each on the next batch of which it takes its part, each
    measured by a Meter; ("memory",) answers this process's figures; ("stop",) ends."""
    assert kind == "cpu", "FSDP2 is raced on the CPU only here"
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # loopback only, should anything read it (the FileStore needs none)
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from shapescript.parallel.memory import Meter
    torch.set_num_threads(threads)
    world = len(indices)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    dist.barrier()
    meter = Meter(torch.device("cpu"))
    conn.send(("ready",))
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        if msg[0] == "setup":
            _, batch, w1, w2, _ = msg
            lo = sum(shares(batch, world)[:rank])
            hi = lo + shares(batch, world)[rank]
            before_model = meter.now()
            model = Mlp(w1, w2)  # (the whole w1 and w2 go with `msg`, at the next message)
            fully_shard(model.l1)
            fully_shard(model.l2)
            fully_shard(model)
            opt = torch.optim.AdamW(model.parameters(), lr=LR)
            batches = Batches(batch)
            conn.send(("ok",))
        elif msg[0] == "steps":  # a block of steps, back to back as in a training loop
            out = []
            for _ in range(msg[2]):
                x, y = batches.next()
                x, y = x[lo:hi], y[lo:hi]
                dist.barrier()  # the ranks start the step together: none times another's draw
                t0 = time.perf_counter()
                with meter.measuring("FSDP2 step"):
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                out.append((time.perf_counter() - t0, loss.item()))
            conn.send(out)
        elif msg[0] == "memory":
            held = sum(local_bytes(p) for p in model.parameters()) + sum(
                local_bytes(t) for state in opt.state.values() for t in state.values() if isinstance(t, torch.Tensor))
            last, largest = meter.last, meter.largest
            assert last is not None and largest is not None, "asked after a block of steps"
            # a plain tuple: the parent can't unpickle a class of this process's __mp_main__
            conn.send((before_model, last.peak, last.added, largest.peak, held))
    dist.destroy_process_group()


# -- what both sides report -------------------------------------------------------------------------

class Memory(NamedTuple):
    """One process's figures, in bytes."""

    before_model: int  # resident once the process was ready, before the model was made
    last_peak: int  # the peak of the last timed step
    last_added: int  # that peak over what was resident when the step began
    largest_peak: int  # the largest peak of any step
    held: int  # params + optimizer state: this process's pieces

    def line(self) -> str:
        over_before = self.last_peak - self.before_model
        return (f"{self.before_model / MIB:8.1f} {self.last_peak / MIB:10.1f} {over_before / MIB:9.1f}"
                f" {self.last_added / MIB:8.1f} {self.largest_peak / MIB:9.1f} {self.held / MIB:8.2f}")


def shapescript_memory(prog: Any, before_model: list[int]) -> list[Memory]:
    """The workers' figures, from `prog.memory()` (the last call: the last timed train_step)."""
    workers = prog.memory()
    assert all(w.last is not None and w.largest is not None for w in workers), "asked after a block of steps"
    return [Memory(before, w.last.peak, w.last.added, w.largest.peak, w.params + w.optimizer_state)
            for before, w in zip(before_model, workers)]


def load(source: str, devices: str, hidden: int, name: str) -> Any:
    """The program with Hd = `hidden`, without the warning that this replaces the declared Hd."""
    import shapescript as ss
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*sizes given when loading replace", category=UserWarning)
        return ss.load(source, devices=devices, dims={"Hd": hidden}, name=name)


def one_configuration(devices: str, world: int, threads: int, hidden: int, batch: int, warmup: int, blocks: int,
                      size: int) -> None:
    """Race the three sides on the MLP with `hidden` units at `batch`, and print their figures."""
    import shapescript as ss
    source = sharded(loop_source(batch))  # the README program, its loop's batches set to `batch`
    prog = load(source, devices, hidden, f"mlp.ss (Hd = {hidden}, shard params)")
    progl = load(source, devices, hidden, f"mlp.ss (Hd = {hidden}, shard params, its loop)")
    ranks = DdpRanks(threads, "cpu", tuple(range(world)), rank_main=fsdp_rank)
    try:
        prog.workers()
        before_model = [w.now for w in prog.memory()]  # the workers started, the program loaded, no model
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=LR)
        ranks.setup(batch, m.w1, m.w2, "")  # the same initial weights, whole
        ml = progl.Mlp.init(seed=0)
        sides = {
            "ShapeScript shard params, prog.train_step": timed_steps(prog, m, opt, Batches(batch)),
            "ShapeScript shard params, the program's loop": timed_loop(progl, ml, ss.adamw(ml, lr=LR), batch, size),
            "FSDP2 (fully_shard each layer, then the root)": ranks.steps("fsdp"),
        }
        times, rounds, worst = race(list(sides.values()), warmup, blocks, size)
        ours = shapescript_memory(prog, before_model)
        theirs = [Memory(*figures) for figures in ranks.ask_all(("memory",))]
    finally:
        ranks.stop()
        prog.stop()
        progl.stop()
    fsdp = statistics.median(times[2])
    params = 784 * hidden + hidden * 10
    print(f"Hd = {hidden} ({params:,} params, {params * 4 / MIB:.1f} MiB f32), batch {batch}: {blocks} blocks of "
          f"{size} steps a side after {warmup} round(s) of warmup; {'median':>10}  {'/ FSDP2':>7}  {'pair ratio':>10}")
    for k, (label, ts) in enumerate(zip(sides, times)):
        pair = statistics.median(r[k] / r[2] for r in rounds)
        print(f"  {label:<48} {statistics.median(ts) * 1e3:>9.3f} ms  {statistics.median(ts) / fsdp:>7.3f}  "
              f"{pair:>10.3f}  ({quantiles(ts)})")
    # RSS, MiB: before the model; the last step's peak, that over "before", and over its own start (the
    # allocator keeps freed pages, so a step in a steady loop adds little); the largest step peak; and
    # the bytes of the params' and AdamW state's pieces that the process holds
    print(f"  memory per worker, MiB {'':18} {'before':>8} {'peak':>10} {'- before':>9} {'- start':>8} "
          f"{'largest':>9} {'held':>8}")
    for label, figures in (("ShapeScript (prog.memory())", ours), ("FSDP2 (the same Meter)", theirs)):
        for rank, f in enumerate(figures):
            print(f"    {label:<27} {rank} {f.line()}")
    print(f"  the first 3 losses of prog.train_step and FSDP2 agree to {worst:.1e}", flush=True)
    if not worst <= LOSS_TOLERANCE:
        sys.exit(f"the first losses differ by {worst:.1e} > {LOSS_TOLERANCE}: "
                 "the two sides don't compute the same step")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions: a smoke test, not a measurement")
    ap.add_argument("--devices", default="cpu[0 1]", help="CPU devices as a devices line lists them (default cpu[0 1])")
    args = ap.parse_args(argv)
    device_set = cpu_devices(ap, args.devices)
    world, devices = device_set.count, str(device_set)
    threads = rank_threads("cpu", world)
    print(f"devices {devices}: ShapeScript's {world} workers (shard params) and torch FSDP2's {world} ranks, Gloo; "
          f"{threads} torch thread(s) each")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; torch {torch.__version__}; "
          f"python {platform.python_version()}; {datetime.datetime.now():%Y-%m-%d %H:%M}; subnormals kept")
    torch.set_num_threads(1)  # the draws of the batches here: no idle OpenMP threads beside the race
    # (Hd, batch, warmup rounds, blocks a side, steps a block): fewer than the ~700 steps a side after
    # which AdamW's subnormal first moments slow every side (docs/benchmarks.md)
    plan = ([(256, 64, 1, 4, 5), (256, 6144, 1, 2, 2), (4096, 64, 1, 2, 3), (4096, 1024, 1, 2, 3)] if args.quick else
            [(256, 64, 1, 20, 10), (256, 6144, 1, 10, 5), (4096, 64, 1, 8, 3), (4096, 1024, 1, 6, 3)])
    for hidden, batch, warmup, blocks, size in plan:
        one_configuration(devices, world, threads, hidden, batch, warmup, blocks, size)


if __name__ == "__main__":
    main()
