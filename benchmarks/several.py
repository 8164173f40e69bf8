"""ShapeScript on two devices against torch DDP: the README's MLP on cpu[0 1], and what the workers cost.

    python benchmarks/several.py            # a few minutes on 2 cores
    python benchmarks/several.py --quick    # well under a minute, for a smoke test

The step: examples/readme/mlp.ss on devices='cpu[0 1]' (two worker processes, Gloo), AdamW with
lr = 1e-3, against the same model in torch.nn.parallel.DistributedDataParallel on two processes
(Gloo, a FileStore in a temporary folder, GLOO_SOCKET_IFNAME=lo), each with the whole batch in its
own memory and taking its half, as the workers take theirs. Every process runs one torch thread
(the workers' own rule: the CPUs shared among them). The sides:

- ShapeScript, `prog.train_step(m, opt, {"img": x, "label": y})` called from Python: timed in the
  controller around the call, so it includes checking the batch, sending each worker its half
  through the pipes, and getting the loss back;
- DDP: loss, backward, AdamW step, timed inside the ranks (after a barrier, the slower rank's time),
  as its own training loop sees it;
- the generated code run in DDP's ranks: the program's compiled train_step, called in each rank on
  its half, as a worker runs it but without the controller and its messages;
- ShapeScript, the program's own loop `prog.run(m, opt, dataset, sink)` over a TensorDataset that
  the workers keep (sent once), so each step sends only the indices of each worker's part and the
  workers gather their rows; only the whole loop is timed (the mean step of each block). The
  README's loop takes batches of 64; for 6144 the program is loaded with that one number changed.

Each side runs blocks of steps back to back, as a training loop does; the blocks take turns (ABCD,
then DCBA) after a warmup, and the sides that draw batches draw the same sequence, so their i-th
steps see the same batch and start from the same weights (their first losses are compared). Each
figure is a median; the ratio is against DDP, and the pair ratio the median of the rounds' ratios.
After the race, in the same run, one device's step for reference (devices='cpu', in this process,
with this process's torch threads).

Also: the workers' cold start (ss.load + the first call, until its result, in fresh processes); the
round trip of one call from the controller (a program `fn ident(x: [n]) -> [n] = x`); what sending
a batch costs (a call that only reads it), and a bare socket pair's time for a worker's half of a
batch of 6144.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Only torch here: the DDP ranks are spawned processes that import this file, and must not pay for
# importing shapescript. shapescript is imported in main().
import torch  # noqa: E402
from common import cpu_model  # noqa: E402  (benchmarks/common.py)
import torch.nn.functional as F  # noqa: E402

PROGRAM = ROOT / "examples" / "readme" / "mlp.ss"
D, HD, C = 784, 256, 10
LR = 1e-3
WORLD = 2
DEVICES = "cpu[0 1]"
TINY = float(torch.finfo(torch.float32).tiny)


def worker_threads() -> int:
    """Torch threads per process, as the ShapeScript workers choose them: the CPUs shared out."""
    return max(1, len(os.sched_getaffinity(0)) // WORLD)


def shares(n: int, workers: int) -> list[int]:
    """How n examples split over the workers, as ShapeScript splits them: the first take one more."""
    return [n // workers + (1 if k < n % workers else 0) for k in range(workers)]


class Batches:
    """The same fresh batches in every process: images in [0, 1], labels from a fixed random linear
    teacher (as benchmarks/step.py), from a generator seeded with the batch size."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.g = torch.Generator().manual_seed(batch)
        self.teacher = torch.randn(D, C, generator=self.g)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.rand(self.batch, D, generator=self.g)
        return x, ((x - 0.5) @ self.teacher).argmax(1)


# -- the DDP side: one spawned process per rank, driven over a pipe --------------------------------

class Mlp(torch.nn.Module):
    def __init__(self, w1: torch.Tensor, w2: torch.Tensor) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(w1.detach().clone())
        self.w2 = torch.nn.Parameter(w2.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w1) @ self.w2


def ddp_rank(rank: int, store_path: str, conn: Any, threads: int) -> None:
    """A rank: ("setup", batch, w1, w2, source) builds the DDP model from w1 and w2 and, from `source`
    (the program's generated Python for cpu[0 1]), the program's model, optimizer and train_step, as a
    worker does; ("steps", kind, k) runs k timed steps of the DDP model (kind "ddp") or of the
    generated code (kind "generated"), each on the next batch of that kind's sequence (drawn whole,
    outside the timing) of which it takes its half; ("stop",) ends."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch.distributed as dist
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD)
    dist.barrier()
    conn.send(("ready",))
    steps: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}
    data: dict[str, Batches] = {}
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        if msg[0] == "setup":
            _, batch, w1, w2, source = msg
            lo = sum(shares(batch, WORLD)[:rank])
            hi = lo + shares(batch, WORLD)[rank]
            model = torch.nn.parallel.DistributedDataParallel(Mlp(w1, w2))
            opt = torch.optim.AdamW(model.parameters(), lr=LR)

            def ddp_step(x: torch.Tensor, y: torch.Tensor, model: Any = model, opt: Any = opt) -> torch.Tensor:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                return loss

            # What a worker does with the program (shapescript/parallel/program_handlers.py), minus the
            # messages: the generated code, run by every rank on its half of the batch.
            from shapescript.runtime.data import Batch
            from shapescript.runtime.model import Model
            from shapescript.runtime.optim import adamw
            ns: dict[str, Any] = {"__name__": "generated_in_the_ranks"}
            exec(compile(source, "<generated for cpu[0 1]>", "exec"), ns)
            ns["DEVICE"] = "cpu"
            gm = Model.init(ns["Mlp_spec"], 0, "cpu")
            gopt = adamw(gm, lr=LR)

            def generated_step(x: torch.Tensor, y: torch.Tensor, train_step: Any = ns["train_step"],
                               spec: Any = ns["Digit_spec"], m: Any = gm, opt: Any = gopt) -> torch.Tensor:
                with torch.no_grad():  # as the worker's `call` handler
                    return train_step(m, opt, Batch(spec, {"img": x, "label": y}))

            steps = {"ddp": ddp_step, "generated": generated_step}
            data = {kind: Batches(batch) for kind in steps}
            conn.send(("ok",))
        elif msg[0] == "steps":  # a block of steps, back to back as in a training loop
            _, kind, k = msg
            step, batches = steps[kind], data[kind]
            out = []
            for _ in range(k):
                x, y = batches.next()
                x, y = x[lo:hi], y[lo:hi]
                dist.barrier()  # both ranks start the step together: neither times the other's draw
                t0 = time.perf_counter()
                loss = step(x, y)
                out.append((time.perf_counter() - t0, loss.item()))
            conn.send(out)
        elif msg[0] == "subnormals":  # how many of AdamW's first moments are subnormal floats
            n = sum(int(((s["exp_avg"] != 0) & (s["exp_avg"].abs() < TINY)).sum()) for s in opt.state.values())
            conn.send((n, sum(s["exp_avg"].numel() for s in opt.state.values())))
    dist.destroy_process_group()


class DdpRanks:
    """The DDP ranks as the controller drives them."""

    def __init__(self, threads: int) -> None:
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.folder = tempfile.mkdtemp(prefix="ddp-bench-")
        t0 = time.perf_counter()
        self.conns, self.procs = [], []
        for rank in range(WORLD):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=ddp_rank, args=(rank, os.path.join(self.folder, "store"), theirs, threads),
                               daemon=True)
            proc.start()
            theirs.close()
            self.conns.append(ours)
            self.procs.append(proc)
        self.ask_all(None)
        self.cold_start_s = time.perf_counter() - t0  # spawned until the group formed

    def ask_all(self, msg: tuple[Any, ...] | None) -> list[Any]:
        if msg is not None:
            for c in self.conns:
                c.send(msg)
        return [c.recv() for c in self.conns]

    def setup(self, batch: int, w1: torch.Tensor, w2: torch.Tensor, source: str) -> None:
        self.ask_all(("setup", batch, w1, w2, source))

    def steps(self, kind: str) -> Callable[[int], list[tuple[float, float]]]:
        """k steps of `kind`: for each, (the slower rank's time, the batch's loss; DDP's is the mean
        of the halves', the generated code's the whole batch's on every rank)."""
        def run(k: int) -> list[tuple[float, float]]:
            per_rank = self.ask_all(("steps", kind, k))
            return [(max(t for t, _ in step), sum(loss for _, loss in step) / WORLD) for step in zip(*per_rank)]
        return run

    def subnormals(self) -> tuple[int, int]:
        return self.conns[0].send(("subnormals",)) or self.conns[0].recv()

    def stop(self) -> None:
        for c in self.conns:
            c.send(("stop",))
        for p in self.procs:
            p.join(10)
        import shutil
        shutil.rmtree(self.folder, ignore_errors=True)


# -- timing ----------------------------------------------------------------------------------------

def race(sides: list[Callable[[int], list[tuple[float, float]]]], warmup: int, blocks: int, size: int
         ) -> tuple[list[list[float]], list[list[float]], float]:
    """Each side's step times, each round's block medians (one per side), and the largest loss
    difference between a side and the first over the first 3 steps (sides that give NaN losses left
    out). Each side runs blocks of `size` steps back to back, as a training loop does; the blocks take
    turns in ABC..CBA order (ABBA for two sides), after `warmup` rounds. The sides that draw batches
    draw the same sequence, so their i-th steps see the same batch."""
    times: list[list[float]] = [[] for _ in sides]
    rounds: list[list[float]] = []
    worst = 0.0
    for i in range(-warmup, blocks):
        order = list(range(len(sides))) if i % 2 == 0 else list(reversed(range(len(sides))))
        results: dict[int, list[tuple[float, float]]] = {}
        for k in order:
            results[k] = sides[k](size)
        if i == -warmup:
            worst = max(abs(la - lb) for r in results.values() for (_, la), (_, lb) in zip(results[0][:3], r[:3])
                        if lb == lb)
        if i >= 0:
            for k, r in results.items():
                times[k] += [t for t, _ in r]
            rounds.append([statistics.median(t for t, _ in results[k]) for k in range(len(sides))])
    return times, rounds, worst


def timed_steps(prog: Any, m: Any, opt: Any, data: Batches) -> Callable[[int], list[tuple[float, float]]]:
    """k steps of `prog.train_step`, each on the next batch (drawn outside the timing): (time, loss)."""
    train_step = prog.train_step

    def steps(k: int) -> list[tuple[float, float]]:
        out = []
        for _ in range(k):
            x, y = data.next()
            batch = {"img": x, "label": y}
            t0 = time.perf_counter()
            loss = train_step(m, opt, batch)
            out.append((time.perf_counter() - t0, float(loss)))
        return out
    return steps


def loop_source(batch: int) -> str:
    """The README program with its loop's batch size set to `batch` (it is 64 there)."""
    source = PROGRAM.read_text()
    assert source.count("batches(64)") == 1
    return source.replace("batches(64)", f"batches({batch})")


def timed_loop(prog: Any, m: Any, opt: Any, batch: int, k: int) -> Callable[[int], list[tuple[float, float]]]:
    """The program's own loop, `prog.run(m, opt, dataset, sink)`, over a TensorDataset of k batches
    (the same every time, sent to the workers on the first run, then kept there): k steps whose
    batches the workers gather themselves. Only the whole loop is timed: each step counts as its
    mean (loss NaN: its batches aren't the other sides')."""
    import shapescript as ss
    data = Batches(batch)
    xs, ys = zip(*(data.next() for _ in range(k)))
    dataset = ss.TensorDataset(img=torch.cat(xs), label=torch.cat(ys))
    sink = ss.sinks.memory()

    def steps(n: int) -> list[tuple[float, float]]:
        assert n == k
        t0 = time.perf_counter()
        prog.run(m, opt, dataset, sink)
        return [((time.perf_counter() - t0) / k, float("nan"))] * k
    return steps


def quantiles(times: list[float]) -> str:
    q = statistics.quantiles(times, n=10)
    return f"p10 {q[0] * 1e3:.3f} ms, p90 {q[-1] * 1e3:.3f} ms"


_COLD = """
import json, sys, time
sys.path.insert(0, {root!r})
import torch
import shapescript as ss
t0 = time.perf_counter()
prog = ss.load({program!r}, devices={devices!r})
m = prog.Mlp.init(seed=0)
t1 = time.perf_counter()
opt = ss.adamw(m, lr=1e-3)
x = torch.rand(64, 784)
t2 = time.perf_counter()
prog.train_step(m, opt, {{"img": x, "label": torch.zeros(64, dtype=torch.long)}})
t3 = time.perf_counter()
print(json.dumps({{"first": t1 - t0, "pool": prog._pool.cold_start_s, "step": t3 - t2}}))
prog.stop()
"""


def cold_starts(processes: int) -> list[dict[str, float]]:
    """In fresh interpreters (torch and shapescript already imported): ss.load + the first call
    (Mlp.init, which starts the workers) until it returns; the pool's own cold_start_s; and the
    first train_step after it."""
    code = _COLD.format(root=str(ROOT), program=str(PROGRAM), devices=DEVICES)
    return [json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                      text=True).stdout.strip().splitlines()[-1]) for _ in range(processes)]


def round_trips(ss: Any, calls: int) -> dict[str, float]:
    """Median seconds of one call of `ident` from the controller: on cpu[0 1], the pool's bare
    `ping` under it, and on one device in this process."""
    source = "fn ident(x: [n]) -> [n] = x\n"
    out = {}
    x = torch.zeros(2)
    for devices in (DEVICES, "cpu"):
        prog = ss.load(source, devices=devices)
        prog.ident(x)
        fns: dict[str, Callable[[], Any]] = {f"prog.ident on {devices}": lambda: prog.ident(x)}
        if devices != "cpu":
            pool = prog._pool
            fns["pool.call('ping') on " + devices] = lambda: pool.call("ping", ())
        for label, f in fns.items():
            for _ in range(50):
                f()
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                f()
                times.append(time.perf_counter() - t0)
            out[label] = statistics.median(times)
        prog.stop()
    return out


_READER = """
import sys
from multiprocessing.connection import Connection
c = Connection(int(sys.argv[1]))
while len(c.recv_bytes()) > 3:
    c.send_bytes(b"ok")
"""


def socket_pair_time(nbytes: int, reps: int) -> float:
    """Median seconds to send `nbytes` to another process over a bare socket pair (the pool's
    channel, with multiprocessing's Connection) and get a 2-byte answer."""
    import socket
    from multiprocessing.connection import Connection
    payload = b"x" * nbytes
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-c", _READER, str(theirs.fileno())], pass_fds=(theirs.fileno(),))
    theirs.close()
    conn = Connection(ours.detach())
    times = []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        conn.send_bytes(payload)
        conn.recv_bytes()
        times.append(time.perf_counter() - t0)
    conn.send_bytes(b"end")
    proc.wait(10)
    conn.close()
    return statistics.median(times[2:])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions: a smoke test, not a measurement")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of this process, for the one-device step (default: torch's own)")
    args = ap.parse_args(argv)
    import shapescript as ss

    one_dev_threads = args.threads if args.threads is not None else torch.get_num_threads()
    load = os.getloadavg()[0]
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load {load:.2f}; torch {torch.__version__}; "
          f"python {platform.python_version()}; {worker_threads()} torch thread(s) per worker and per rank, "
          f"{one_dev_threads} for one device; subnormals kept (the workers can't be told to flush them)")

    runs = 1 if args.quick else 3
    colds = cold_starts(runs)
    med = {k: statistics.median(c[k] for c in colds) for k in colds[0]}
    print(f"cold start on {DEVICES}, median of {runs} fresh process(es): ss.load + Mlp.init {med['first']:.3f} s "
          f"(pool cold_start_s {med['pool']:.3f} s); the first train_step after it {med['step'] * 1e3:.1f} ms")

    rtts = round_trips(ss, 200 if args.quick else 2000)
    for label, t in rtts.items():
        print(f"round trip, {label}: {t * 1e6:.0f} us (median)")

    torch.set_num_threads(1)  # the draws of the batches here: no idle OpenMP threads spinning beside the race
    ddp = DdpRanks(worker_threads())
    print(f"DDP ranks: spawned until the process group formed: {ddp.cold_start_s:.3f} s")
    # (batch, warmup pairs of blocks, blocks of each side, steps a block): each side runs fewer than the
    # ~700 steps after which AdamW's first moments of dead ReLU units reach the subnormal floats
    plan = [(64, 1, 10, 5), (6144, 1, 4, 2)] if args.quick else [(64, 2, 50, 10), (6144, 1, 40, 5)]
    prog2 = ss.load(PROGRAM, devices=DEVICES)
    for batch, warmup, blocks, size in plan:
        m2 = prog2.Mlp.init(seed=0)
        opt2 = ss.adamw(m2, lr=LR)
        ddp.setup(batch, m2.w1, m2.w2, prog2.python_source)
        progl = ss.load(loop_source(batch), devices=DEVICES, name=f"mlp.ss with batches({batch})")
        ml = progl.Mlp.init(seed=0)
        sides = {
            "ShapeScript, prog.train_step(m, opt, batch dict)": timed_steps(prog2, m2, opt2, Batches(batch)),
            "DDP": ddp.steps("ddp"),
            "the generated code run in DDP's ranks": ddp.steps("generated"),
            "ShapeScript, the program's loop (prog.run)": timed_loop(progl, ml, ss.adamw(ml, lr=LR), batch, size),
        }
        times, rounds, worst = race(list(sides.values()), warmup, blocks, size)
        progl.stop()
        sub, total = ddp.subnormals()
        # one device, after the race, in this process, with its threads
        torch.set_num_threads(one_dev_threads)
        prog1 = ss.load(PROGRAM, devices="cpu")
        m1 = prog1.Mlp.init(seed=0)
        steps1 = timed_steps(prog1, m1, ss.adamw(m1, lr=LR), Batches(batch))
        steps1(warmup * size)
        ones = [t for t, _ in steps1(blocks * size)]
        torch.set_num_threads(1)
        ddp_median = statistics.median(times[1])
        print(f"batch {batch}: {blocks} blocks of {size} steps a side, after {warmup} round(s) of warmup; "
              f"{'median':>10}  {'/ DDP':>6}  {'pair ratio':>10}")
        for k, (label, ts) in enumerate(zip(sides, times)):
            ratio = statistics.median(ts) / ddp_median
            pair = statistics.median(r[k] / r[1] for r in rounds)
            print(f"  {label:<52} {statistics.median(ts) * 1e3:>7.3f} ms  {ratio:>6.3f}  {pair:>10.3f}  "
                  f"({quantiles(ts)})", flush=True)
        print(f"  {'one device (devices=cpu), after the race':<52} {statistics.median(ones) * 1e3:>7.3f} ms  "
              f"{statistics.median(ones) / ddp_median:>6.3f}  {'':>10}  ({quantiles(ones)})")
        print(f"  the first 3 losses of prog.train_step, DDP and the generated code in the ranks agree to "
              f"{worst:.1e}; DDP's AdamW first moments subnormal at the end: {sub} of {total}", flush=True)
    ddp.stop()
    prog2.stop()

    # What sending a batch costs: a function of the program that only reads its batch (no collective,
    # a [b] result), on cpu[0 1] against one device.
    source = PROGRAM.read_text() + "\nfn rows(batch: [b] Digit) -> [b] = sum(batch.img, over=D)\n"
    print("a call that only reads the batch, `fn rows(batch: [b] Digit) -> [b] = sum(batch.img, over=D)`, median:")
    for batch, calls in ((64, 50 if args.quick else 500), (6144, 10 if args.quick else 100)):
        x, y = Batches(batch).next()
        data = {"img": x, "label": y}
        row = []
        for devices in (DEVICES, "cpu"):
            prog = ss.load(source, devices=devices, name="mlp.ss + rows")
            torch.set_num_threads(one_dev_threads if devices == "cpu" else 1)
            for _ in range(5):
                prog.rows(data)
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                prog.rows(data)
                times.append(time.perf_counter() - t0)
            row.append(statistics.median(times))
            prog.stop()
        mb = (x.numel() * x.element_size() + y.numel() * y.element_size()) / 2**20
        print(f"  batch {batch:>4} ({mb:.2f} MiB): {row[0] * 1e3:.3f} ms on {DEVICES}, {row[1] * 1e3:.3f} ms on one device")
    half = 6144 // WORLD * (D * 4 + 8)
    print(f"  for comparison, a worker's half of a batch of 6144 ({half / 2**20:.2f} MiB) through a bare socket "
          f"pair to another process, and a 2-byte answer: {socket_pair_time(half, 5 if args.quick else 30) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
