"""Cold start on several devices: ShapeScript's workers against torch DDP's ranks, in one run.

    python benchmarks/cold_start.py                        # cpu[0 1], 5 fresh processes a side: about a minute
    python benchmarks/cold_start.py --runs 9               # more processes a side
    python benchmarks/cold_start.py --quick                # 2 a side: a smoke test, not a figure
    python benchmarks/cold_start.py --devices 'cuda[0 1]'  # on GPUs (NCCL)
    python benchmarks/cold_start.py --against OTHER        # also the ShapeScript of another checkout (before/after)

Every figure is taken in a fresh interpreter that has imported torch (and, for ShapeScript, shapescript)
before its clock starts; the sides take turns (A B, then B A, ...), and each figure is the median of
its side's processes. The ratio is ShapeScript's median over DDP's, and the pair ratio the median of
the rounds' ratios.

- ShapeScript, `ss.load(examples/readme/mlp.ss, devices=...)` and its first call,
  `prog.Mlp.init(seed=0)`, which starts the workers, until it returns: every worker has joined the
  process group, loaded the program and drawn its part of the model. Also the pool's own
  `cold_start_s` (from spawning the workers until every one has joined the group and done its first
  all-reduce) and the first `train_step` after it.
- DDP: `torch.multiprocessing.start_processes` (spawn) of as many ranks, each importing torch,
  `init_process_group` (Gloo on cpu[...], NCCL on cuda[...], with a FileStore in a temporary folder
  and the loopback interface, as the workers) and one all-reduce, until every rank has said so to the
  parent: the point where the pool's `cold_start_s` stops.
- Then a second start in the same process, as after a failure or for another devices line: the
  same program loaded again and its model drawn (ShapeScript's fork server forks the workers), and
  DDP's ranks spawned again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
PROGRAM = ROOT / "examples" / "readme" / "mlp.ss"

# Only torch here: DDP's ranks are spawned processes that import this module for `ddp_rank`.
import torch  # noqa: E402


def ddp_rank(rank: int, world: int, kind: str, store_path: str, ready: Any, done: Any) -> None:
    """A DDP rank as a training script starts one: join the group, one all-reduce, then say so."""
    import torch.distributed as dist
    os.environ["NCCL_SOCKET_IFNAME" if kind == "cuda" else "GLOO_SOCKET_IFNAME"] = "lo"
    device = torch.device("cuda", rank) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if kind == "cuda" else "gloo", store=dist.FileStore(store_path, world),
                            rank=rank, world_size=world, device_id=device if kind == "cuda" else None)
    dist.all_reduce(torch.ones(1, device=device))
    ready.put(rank)
    done.wait()
    dist.destroy_process_group()


def ddp_cold_start(world: int, kind: str) -> dict[str, float]:
    """Seconds from spawning `world` DDP ranks until every one has joined the group and all-reduced."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    ready, done = ctx.SimpleQueue(), ctx.Event()
    with tempfile.TemporaryDirectory(prefix="ddp-cold-") as folder:
        t0 = time.perf_counter()
        procs = mp.start_processes(ddp_rank, args=(world, kind, os.path.join(folder, "store"), ready, done),
                                   nprocs=world, join=False, start_method="spawn")
        for _ in range(world):
            ready.get()
        seconds = time.perf_counter() - t0
        done.set()
        while not procs.join():
            pass
    return {"ready": seconds}


_SHAPESCRIPT = """
import json, sys, time
sys.path.insert(0, {root!r})
import torch
import shapescript as ss
assert ss.__file__.startswith({root!r}), ss.__file__
t0 = time.perf_counter()
prog = ss.load({program!r}, devices={devices!r})
t1 = time.perf_counter()
m = prog.Mlp.init(seed=0)
t2 = time.perf_counter()
opt = ss.adamw(m, lr=1e-3)
batch = {{"img": torch.rand(64, 784), "label": torch.zeros(64, dtype=torch.long)}}
t3 = time.perf_counter()
prog.train_step(m, opt, batch)
t4 = time.perf_counter()
pool_s = prog._pool.cold_start_s
prog.stop()
t5 = time.perf_counter()  # a second start in the same process: a restart, another devices line
again = ss.load({program!r}, devices={devices!r})
again.Mlp.init(seed=0)
t6 = time.perf_counter()
again.stop()
print(json.dumps({{"ready": t2 - t0, "load": t1 - t0, "pool": pool_s, "step": t4 - t3,
                  "again": t6 - t5}}))
"""

_DDP = """
import json, sys
sys.path.insert(0, {here!r})
import torch
import cold_start
first = cold_start.ddp_cold_start({world!r}, {kind!r})
first["again"] = cold_start.ddp_cold_start({world!r}, {kind!r})["ready"]  # spawned again, as torchrun would
print(json.dumps(first))
"""


def fresh(code: str) -> dict[str, float]:
    """The JSON that `code` prints last, run in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"a fresh process failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def shapescript_code(devices: str, root: Path = ROOT) -> str:
    return _SHAPESCRIPT.format(root=str(root), program=str(PROGRAM), devices=devices)


def cold_starts(processes: int, devices: str, root: Path = ROOT) -> list[dict[str, float]]:
    """ShapeScript's cold start in `processes` fresh interpreters, one after the other: "ready" (ss.load
    + Mlp.init until it returns), "load" (ss.load alone), "pool" (its cold_start_s), "step" (the first
    train_step)."""
    return [fresh(shapescript_code(devices, root)) for _ in range(processes)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh processes a side (default 5)")
    ap.add_argument("--quick", action="store_true", help="2 processes a side: a smoke test, not a figure")
    ap.add_argument("--devices", default="cpu[0 1]", help="two devices or more, cpu[...] or cuda[...] (default cpu[0 1])")
    ap.add_argument("--against", type=Path, default=None,
                    help="another checkout of ShapeScript (its root folder), run as a third side")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from common import cpu_model

    from shapescript.api import parse_devices
    device_set = parse_devices(args.devices)
    if device_set.count < 2 or device_set.kind not in ("cpu", "cuda"):
        ap.error(f"--devices {args.devices!r}: list two devices or more, e.g. 'cpu[0 1]' or 'cuda[0 1]'")
    if device_set.kind == "cuda" and tuple(device_set.indices or ()) != tuple(range(device_set.count)):
        ap.error("--devices: DDP's ranks take cuda:0, cuda:1, ...: list them from 0 (cuda[0 1])")
    runs = 2 if args.quick else args.runs
    devices = str(device_set)
    sides: dict[str, str] = {"ShapeScript": shapescript_code(devices)}
    if args.against is not None:
        sides[f"ShapeScript at {args.against}"] = shapescript_code(devices, args.against.resolve())
    sides["DDP"] = _DDP.format(here=str(HERE), world=device_set.count, kind=device_set.kind)
    print(f"cold start on {devices}: {runs} fresh processes a side, alternating; machine: {cpu_model()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; torch {torch.__version__}")
    results: dict[str, list[dict[str, float]]] = {label: [] for label in sides}
    for run in range(runs):
        for label in (list(sides) if run % 2 == 0 else list(sides)[::-1]):
            results[label].append(fresh(sides[label]))
    ddp = statistics.median(r["ready"] for r in results["DDP"])
    for label, rows in results.items():
        ready = statistics.median(r["ready"] for r in rows)
        pair = statistics.median(r["ready"] / d["ready"] for r, d in zip(rows, results["DDP"]))
        spread = f"{min(r['ready'] for r in rows):.3f}-{max(r['ready'] for r in rows):.3f} s"
        if label == "DDP":
            print(f"  {label:<24} spawn until every rank joined and all-reduced: {ready:.3f} s ({spread})")
            continue
        med = {k: statistics.median(r[k] for r in rows) for k in ("load", "pool", "step")}
        print(f"  {label:<24} ss.load + Mlp.init: {ready:.3f} s ({spread}), {ready / ddp:.3f} x DDP "
              f"(pair ratio {pair:.3f}); of which ss.load {med['load'] * 1e3:.0f} ms; pool cold_start_s "
              f"{med['pool']:.3f} s ({med['pool'] / ddp:.3f} x DDP); then the first train_step "
              f"{med['step'] * 1e3:.1f} ms")
    ddp_again = statistics.median(r["again"] for r in results["DDP"])
    for label, rows in results.items():
        again = statistics.median(r["again"] for r in rows)
        print(f"  a second start in the same process, {label}: {again:.3f} s ({again / ddp_again:.3f} x DDP's)")
    ours = statistics.median(r["ready"] for r in results["ShapeScript"])
    print(f"cold start: {'<=' if ours <= ddp else '>'} DDP's in the same run ({ours:.3f} s against {ddp:.3f} s)")


if __name__ == "__main__":
    main()
