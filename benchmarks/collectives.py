"""An all-reduce between worker processes of this machine: Gloo's against shared memory's
(runtime/shm_reduce.py), side by side in one run.

    python benchmarks/collectives.py              # 2 processes: about 20 s
    python benchmarks/collectives.py --world 3
    python benchmarks/collectives.py --quick      # a smoke test, not a figure

Sizes: 2 floats (the README loss's sum and count, 8 bytes) and 203,264 floats (the README MLP's
gradients, 813,056 bytes). Each process sums a tensor of its own, in rounds of 50 all-reduces, Gloo's
round and shared memory's taking turns; each figure is the median round's time per all-reduce, as
rank 0 sees it. Also the raw floor of a message between processes here: a byte sent to each other
process through a pipe and back (what any all-reduce of processes that sleep while they wait pays).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from shapescript.runtime import shm_reduce  # noqa: E402

SIZES = {"8 bytes": 2, "813,056 bytes": 203_264}


def rank_main(rank: int, world: int, folder: str, path: str, rounds: int, per_round: int, out: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), world),
                            rank=rank, world_size=world)
    shm = shm_reduce.SharedMemoryAllReduce(path, rank, world, timeout=60)
    ways = {"Gloo": dist.all_reduce, "shared memory": shm.all_reduce}
    for label, size in SIZES.items():
        t = torch.full((size,), float(rank + 1))
        times: dict[str, list[float]] = {w: [] for w in ways}
        for r in range(rounds + 1):  # the first round warms up
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for way in order:
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(per_round):
                    ways[way](t)
                if r:
                    times[way].append((time.perf_counter() - t0) / per_round)
        if rank == 0:
            out[label] = {w: statistics.median(ts) for w, ts in times.items()}
    dist.destroy_process_group()


def pipe_floor(world: int, rounds: int) -> float:
    """Seconds for a byte to each of `world - 1` processes through a pipe and back, the median round."""
    ends = []
    for _ in range(world - 1):
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the echo: nothing but os calls, no torch
            while os.read(down_r, 1) == b"x":
                os.write(up_w, b"x")
            os._exit(0)
        ends.append((down_w, up_r, pid))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(200):
            for down_w, _, _ in ends:
                os.write(down_w, b"x")
            for _, up_r, _ in ends:
                os.read(up_r, 1)
        times.append((time.perf_counter() - t0) / 200)
    for down_w, _, pid in ends:
        os.write(down_w, b"q")
        os.waitpid(pid, 0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not shm_reduce.supported():
        sys.exit("shared-memory all-reduces need x86-64 and /dev/shm (and SHAPESCRIPT_SHM_REDUCE not off)")
    rounds, per_round = (2, 5) if args.quick else (20, 50)
    path = shm_reduce.create(args.world)
    assert path is not None, "no room in /dev/shm"
    try:
        with tempfile.TemporaryDirectory(prefix="ss-bench-collectives-") as folder, mp.Manager() as manager:
            out = manager.dict()
            os.environ.update(GLOO_SOCKET_IFNAME="lo")
            mp.start_processes(rank_main, args=(args.world, folder, path, rounds, per_round, out),
                               nprocs=args.world, start_method="spawn")
            results = dict(out)
    finally:
        shm_reduce.remove(path)
    print(f"all-reduce between {args.world} processes; machine: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__}; medians of {rounds} rounds of {per_round}")
    for label, by_way in results.items():
        gloo, shm = by_way["Gloo"], by_way["shared memory"]
        print(f"  {label:>14}: Gloo {gloo * 1e6:8.1f} us   shared memory {shm * 1e6:8.1f} us   "
              f"shared / Gloo {shm / gloo:.3f}")
    print(f"  a byte to each other process through a pipe and back: {pipe_floor(args.world, rounds) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
