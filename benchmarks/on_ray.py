"""What running the workers on Ray costs: the README MLP's own loop on `cpu[0 1]` with its
workers as Ray actors against the same program on this machine's own worker processes, and the cold
start of each, side by side in one run.

    python benchmarks/on_ray.py                 # batches of 64 and 6144, 6 rounds, 4 cold starts a side
    python benchmarks/on_ray.py --quick         # a smoke test, not a figure

Needs `pip install 'shapescript[ray]'`. The cluster is one Ray node started here on 127.0.0.1 (as
the tests' simulated nodes), so both sides run on the same cores: the figures are Ray's overhead, not
a network's.

- The loop: `prog.run(m, opt, dataset, sink)` over a TensorDataset the workers keep (sent once,
  before the timing), into a memory sink; the two programs run at once (the local one started before
  the cluster was made current, so its workers stay on this machine) and take turns pass by pass
  (ABBA). The losses must be equal both ways. Figures are medians of the per-step times over the
  rounds, and the pair ratio the median of the rounds' ratios.
- Cold start: `ss.load(...)` and its first call, `prog.Mlp.init(seed=0)`, which starts the workers,
  until it returns, alternating local and Ray; the pool's own `cold_start_s` too. Ray's side
  includes reserving the placement group and starting the actors (Ray keeps idle Python workers
  ready; they import torch and shapescript when they become ours).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported: keep it on 127.0.0.1

import torch  # noqa: E402

import shapescript as ss  # noqa: E402

MLP = (ROOT / "examples" / "readme" / "mlp.ss").read_text()
SIDES = ("local", "ray")


def one_pass(prog: Any, m: Any, opt: Any, data: ss.TensorDataset) -> tuple[float, list[float]]:
    sink = ss.sinks.memory()
    start = time.perf_counter()
    prog.run(m, opt, data, sink)
    return time.perf_counter() - start, [r["loss"] for r in sink.records]


def loop_race(cluster: Any, devices: str, batch: int, steps: int, rounds: int) -> None:
    source = MLP.replace("batches(64)", f"batches({batch})")
    g = torch.Generator().manual_seed(0)
    n = batch * steps
    data = ss.TensorDataset(img=torch.randn(n, 784, generator=g), label=torch.randint(0, 10, (n,), generator=g))
    progs: dict[str, Any] = {}
    try:
        models = {}
        for side in SIDES:  # the local workers start (at the first call) while no cluster is current
            if side == "ray":
                ss.cluster(cluster)
            progs[side] = ss.load(source, devices=devices, name="mlp.ss")
            models[side] = progs[side].Mlp.init(seed=0)
        opts = {side: ss.adamw(m, lr=1e-3) for side, m in models.items()}
        assert progs["ray"].pool._launcher is not None and progs["local"].pool._launcher is None
        for side in SIDES:  # warm up: the dataset sent, the first steps
            one_pass(progs[side], models[side], opts[side], data)
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        for r in range(rounds):
            losses = {}
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                seconds, losses[side] = one_pass(progs[side], models[side], opts[side], data)
                times[side].append(seconds / steps)
            assert losses["ray"] == losses["local"], "the workers on Ray computed something else"
        local, ray_ = statistics.median(times["local"]), statistics.median(times["ray"])
        pair = statistics.median(a / b for a, b in zip(times["ray"], times["local"]))
        print(f"| loop, batch {batch:>5} | {local * 1e3:8.3f} ms | {ray_ * 1e3:8.3f} ms | {ray_ / local:.3f} | {pair:.3f} |",
              flush=True)
    finally:
        for prog in progs.values():
            prog.stop()
        ss.cluster(None)


def cold_starts(cluster: Any, devices: str, runs: int) -> None:
    walls: dict[str, list[float]] = {side: [] for side in SIDES}
    pools: dict[str, list[float]] = {side: [] for side in SIDES}
    for r in range(runs):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            if side == "ray":
                ss.cluster(cluster)
            start = time.perf_counter()
            prog = ss.load(MLP, devices=devices, name="mlp.ss")
            try:
                prog.Mlp.init(seed=0)
                walls[side].append(time.perf_counter() - start)
                pools[side].append(prog.pool.cold_start_s)
            finally:
                prog.stop()
                ss.cluster(None)
    local, ray_ = statistics.median(walls["local"]), statistics.median(walls["ray"])
    pair = statistics.median(a / b for a, b in zip(walls["ray"], walls["local"]))
    print(f"| cold start (load + first call) | {local:8.3f} s | {ray_:8.3f} s | {ray_ / local:.3f} | {pair:.3f} |")
    print(f"| the pool's own cold_start_s | {statistics.median(pools['local']):8.3f} s | "
          f"{statistics.median(pools['ray']):8.3f} s | "
          f"{statistics.median(pools['ray']) / statistics.median(pools['local']):.3f} | |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="cpu[0 1]")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--starts", type=int, default=4, help="cold starts a side")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 2 rounds, fewer steps, 2 starts")
    args = parser.parse_args()
    rounds, starts = (2, 2) if args.quick else (args.rounds, args.starts)
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        sys.exit("this benchmark needs Ray: pip install 'shapescript[ray]'")
    folder = tempfile.mkdtemp(prefix="ssray-", dir="/tmp")  # Ray's sockets need a short path
    os.environ["RAY_TMPDIR"] = folder
    cores = os.cpu_count() or 2
    cluster = Cluster(initialize_head=True, shutdown_at_exit=False, head_node_args={
        "num_cpus": max(2, cores), "node_ip_address": "127.0.0.1", "include_dashboard": False})
    try:
        ray.init(address=cluster.address)  # ours: ss.cluster(None) between sides leaves it connected
        print(f"{platform.processor() or platform.machine()}, {cores} cores, torch {torch.__version__}, "
              f"ray {ray.__version__}, {args.devices}, {rounds} rounds, {starts} cold starts a side")
        print("| what | local workers | Ray actors | ratio of medians | pair ratio |")
        print("|---|---:|---:|---:|---:|")
        loop_race(cluster, args.devices, 64, 20 if args.quick else 100, rounds)
        loop_race(cluster, args.devices, 6144, 3 if args.quick else 10, rounds)
        cold_starts(cluster, args.devices, starts)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
