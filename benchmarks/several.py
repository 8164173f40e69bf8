"""ShapeScript on several devices against torch DDP: the README's MLP, and what the workers cost.

    python benchmarks/several.py                         # cpu[0 1]: a few minutes on 2 cores
    python benchmarks/several.py --quick                 # well under a minute, for a smoke test
    python benchmarks/several.py --devices 'cuda[0 1]'   # on GPUs (also cpu[0 1 2], cuda[0 1 2 3], ...)

The step: examples/readme/mlp.ss on --devices (default 'cpu[0 1]': two worker processes, Gloo),
AdamW with lr = 1e-3, against the same model in torch.nn.parallel.DistributedDataParallel on as many
processes (the same backend: Gloo with GLOO_SOCKET_IFNAME=lo on cpu[...], NCCL with
NCCL_SOCKET_IFNAME=lo on cuda[...]; a FileStore in a temporary folder), each with the whole batch in
its own memory and taking its part, as the workers take theirs. On cpu[...] every process runs the
CPUs shared among the processes in torch threads (the workers' own rule: one each on 2 cores for
cpu[0 1]). On cuda[...] each rank runs on its GPU, cuda:<index> (the model and its part of the batch
moved there before the timing, each step ended by torch.cuda.synchronize() before the clock is
read) with min(4, cores) torch threads; the workers pick their GPUs themselves, and the batches
passed from Python are CPU tensors that they move. The sides:

- ShapeScript, `prog.train_step(m, opt, {"img": x, "label": y})` called from Python: timed in the
  controller around the call, so it includes checking the batch, sending each worker its part
  through the pipes, and getting the loss back;
- DDP: loss, backward, AdamW step, timed inside the ranks (after a barrier, the slowest rank's time),
  as its own training loop sees it;
- the generated code run in DDP's ranks: the program's compiled train_step, called in each rank on
  its part, as a worker runs it but without the controller and its messages;
- ShapeScript, the program's own loop `prog.run(m, opt, dataset, sink)` over a TensorDataset that
  the workers keep (sent once), so each step sends only the indices of each worker's part and the
  workers gather their rows; only the whole loop is timed (the mean step of each block). The
  README's loop takes batches of 64; for 6144 the program is loaded with that one number changed;
- for reference, DDP as hand-written over the loop's own dataset kept whole in each rank: each step
  gathers the rank's shuffled rows (`index_select`, the README's shuffle(seed=0)) inside its timing,
  the data work that the program's loop does and the DDP side above leaves out. The loop is also
  compared with this side.

Each side runs blocks of steps back to back, as a training loop does; the blocks take turns (ABCDE,
then EDCBA) after a warmup, and the sides that draw batches draw the same sequence, so their i-th
steps see the same batch and start from the same weights (their first losses are compared). Each
figure is a median; the ratio is against DDP, and the pair ratio the median of the rounds' ratios.
After the race, in the same run, one device's step for reference, in this process: devices='cpu'
with this process's torch threads for cpu[...], devices='cuda' (cuda:0, its batches passed as CPU
tensors, synchronized before the clock is read) for cuda[...].

Also: the workers' cold start (ss.load + the first call, until its result, in fresh processes); the
round trip of one call from the controller (a program `fn ident(x: [n]) -> [n] = x`); what sending
a batch costs (a call that only reads it), and a bare socket pair's time for a worker's part of a
batch of 6144; each against one device as above.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Only torch here: the DDP ranks are spawned processes that import this file, and must not pay for
# importing shapescript. shapescript is imported in main().
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from cold_start import cold_starts  # noqa: E402  (benchmarks/cold_start.py)
from common import cpu_model  # noqa: E402  (benchmarks/common.py)

PROGRAM = ROOT / "examples" / "readme" / "mlp.ss"
D, HD, C = 784, 256, 10
LR = 1e-3
TINY = float(torch.finfo(torch.float32).tiny)
GATHERING = "ddp, gathering"  # the ranks' side doing the loop's data work (gathering_step)


def cpu_devices(ap: argparse.ArgumentParser, text: str, divides: int | None = None) -> Any:
    """--devices as a DeviceSet of two CPU devices or more (that divide `divides`), or the parser's
    usage error."""
    from shapescript.api import parse_devices
    try:
        device_set = parse_devices(text)
    except ValueError as e:
        ap.error(f"--devices: {e}")
    if device_set.kind != "cpu" or device_set.count < 2 or (divides is not None and divides % device_set.count):
        ap.error(f"--devices {text!r}: list two CPU devices or more, e.g. 'cpu[0 1]'"
                 + (f", that divide {divides}" if divides is not None else ""))
    return device_set


def rank_threads(kind: str, world: int) -> int:
    """Torch threads per DDP rank: on cpu[...] as the ShapeScript workers choose them, the CPUs shared
    out; on cuda[...], where the GPUs compute, a few (the workers keep torch's default there)."""
    cores = len(os.sched_getaffinity(0))
    return max(1, cores // world) if kind == "cpu" else min(4, cores)


def synced(f: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """`f` as timed on the device kind `kind`: on a GPU, whose work a call only queues, the call and
    then waiting for that work (on the CPU, `f` itself)."""
    if kind != "cuda":
        return f

    def call(*args: Any) -> Any:
        out = f(*args)
        torch.cuda.synchronize()
        return out
    return call


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


def ddp_rank(rank: int, store_path: str, conn: Any, threads: int, kind: str, indices: tuple[int, ...]) -> None:
    """A rank of len(indices) (a spawned process: everything it needs comes as arguments), on the CPU
    with Gloo (kind "cpu") or on cuda:indices[rank] with NCCL (kind "cuda"). ("setup", batch, w1, w2,
    source) builds the DDP model from w1 and w2 and, from `source` (the program's generated Python
    for the devices), the program's model, optimizer and train_step, as a worker does; ("steps",
    side, k) runs k timed steps of the DDP model (side "ddp") or of the generated code (side
    "generated"), each on the next batch of that side's sequence (drawn whole, outside the timing)
    of which it takes its part, moved to its device; a sixth item of "setup", `kept` > 0, adds the
    side GATHERING (gathering_step over a dataset of `kept` batches); ("stop",) ends."""
    world, cuda = len(indices), kind == "cuda"
    os.environ["NCCL_SOCKET_IFNAME" if cuda else "GLOO_SOCKET_IFNAME"] = "lo"
    import torch.distributed as dist
    torch.set_num_threads(threads)
    device = torch.device("cuda", indices[rank]) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world, device_id=device if cuda else None)
    dist.barrier()
    conn.send(("ready",))
    steps: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}
    data: dict[str, Batches] = {}
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        if msg[0] == "setup":
            batch, w1, w2, source = msg[1:5]
            lo = sum(shares(batch, world)[:rank])
            hi = lo + shares(batch, world)[rank]
            model = torch.nn.parallel.DistributedDataParallel(Mlp(w1, w2).to(device),
                                                              device_ids=[device] if cuda else None)
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
            exec(compile(source, f"<generated for {kind}{list(indices)}>", "exec"), ns)
            ns["DEVICE"] = str(device)
            gm = Model.init(ns["Mlp_spec"], 0, device)
            gopt = adamw(gm, lr=LR)

            def generated_step(x: torch.Tensor, y: torch.Tensor, train_step: Any = ns["train_step"],
                               spec: Any = ns["Digit_spec"], m: Any = gm, opt: Any = gopt) -> torch.Tensor:
                with torch.no_grad():  # as the worker's `call` handler
                    return train_step(m, opt, Batch(spec, {"img": x, "label": y}))

            steps = {"ddp": synced(ddp_step, kind), "generated": synced(generated_step, kind)}
            data: dict[str, Any] = {side: Batches(batch) for side in steps}
            kept = msg[5] if len(msg) > 5 else 0
            if kept:  # DDP over the loop's dataset, kept whole in each rank, gathering its shuffled rows
                steps[GATHERING] = synced(gathering_step(Mlp(w1, w2), batch, kept, device), kind)
                data[GATHERING] = KeptOrder(batch, kept, device)
            conn.send(("ok",))
        elif msg[0] == "steps":  # a block of steps, back to back as in a training loop
            _, side, k = msg
            step, batches = steps[side], data[side]
            out = []
            for _ in range(k):
                x, y = batches.next()
                x, y = x[lo:hi].to(device), y[lo:hi].to(device)
                dist.barrier()  # the ranks start the step together: none times another's draw
                if cuda:  # with NCCL the barrier, and the copies, may still be queued on the GPU
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                loss = step(x, y)
                # the gathering side's batches are the loop's, not the sequence the others draw
                out.append((time.perf_counter() - t0, loss.item() if side != GATHERING else math.nan))
            conn.send(out)
        elif msg[0] == "subnormals":  # how many of AdamW's first moments are subnormal floats
            n = sum(int(((s["exp_avg"] != 0) & (s["exp_avg"].abs() < TINY)).sum()) for s in opt.state.values())
            conn.send((n, sum(s["exp_avg"].numel() for s in opt.state.values())))
    dist.destroy_process_group()


class KeptOrder:
    """The batches of the program's loop over a dataset of `kept` batches (`timed_loop`'s), as indices:
    the README's shuffle(seed=0), one batch a step, on `device`. `next()` gives the whole
    batch's indices twice, in the place of DDP's drawn (x, y), and each rank takes its part of them."""

    def __init__(self, batch: int, kept: int, device: torch.device) -> None:
        from shapescript.runtime.loops import shuffle_order  # the loop's own order (setup imports the runtime)
        self.batch, self.kept, self.step = batch, kept, 0
        self.order = shuffle_order(batch * kept, (0,)).to(device)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        first = (self.step % self.kept) * self.batch
        self.step += 1
        rows = self.order[first:first + self.batch]
        return rows, rows


def gathering_step(model: torch.nn.Module, batch: int, kept: int, device: torch.device
                   ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A DDP step as hand-written over a TensorDataset kept whole in each rank: the rank's shuffled
    rows gathered (index_select) inside the step, then loss, backward, AdamW. The dataset is the
    loop's (`timed_loop`: `kept` batches drawn by Batches(batch))."""
    x_all, y_all = (t.to(device) for t in loop_data(batch, kept))
    cuda = device.type == "cuda"
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(device), device_ids=[device] if cuda else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=LR)

    def step(rows: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(ddp(x_all.index_select(0, rows)), y_all.index_select(0, rows))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


class DdpRanks:
    """The DDP ranks as the controller drives them (`rank_main`: another rank with ddp_rank's arguments
    and its "steps" and "stop" messages, as benchmarks/sharded.py's FSDP2 ranks)."""

    def __init__(self, threads: int, kind: str, indices: tuple[int, ...],
                 rank_main: Callable[..., None] = ddp_rank) -> None:
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.folder = tempfile.mkdtemp(prefix="ddp-bench-")
        self.world = len(indices)
        t0 = time.perf_counter()
        self.conns, self.procs = [], []
        for rank in range(self.world):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=rank_main, daemon=True,
                               args=(rank, os.path.join(self.folder, "store"), theirs, threads, kind, indices))
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

    def setup(self, batch: int, w1: torch.Tensor, w2: torch.Tensor, source: str, kept: int = 0) -> None:
        """Each rank's sides for `batch`; `kept` > 0 adds GATHERING over a dataset of that
        many batches (ddp_rank)."""
        self.parts = shares(batch, self.world)
        self.ask_all(("setup", batch, w1, w2, source) + ((kept,) if kept else ()))

    def steps(self, side: str) -> Callable[[int], list[tuple[float, float]]]:
        """k steps of `side`: for each, (the slowest rank's time, the batch's loss; DDP's is the mean
        of the parts', weighted by their sizes, the generated code's the whole batch's on every rank)."""
        def run(k: int) -> list[tuple[float, float]]:
            per_rank = self.ask_all(("steps", side, k))
            return [(max(t for t, _ in step), sum(loss * n for (_, loss), n in zip(step, self.parts)) / sum(self.parts))
                    for step in zip(*per_rank)]
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


def timed_steps(prog: Any, m: Any, opt: Any, data: Any, fields: tuple[str, str] = ("img", "label"),
                extra: tuple[Any, ...] = ()) -> Callable[[int], list[tuple[float, float]]]:
    """k steps of `prog.train_step(m, opt, batch, *extra)`, each on the next batch of `data` (a
    Batches or anything whose next() gives two tensors, named `fields`; drawn outside the timing):
    (time, loss)."""
    train_step = synced(prog.train_step, prog.device.type)  # (on several devices the controller's: cpu)

    def steps(k: int) -> list[tuple[float, float]]:
        out = []
        for _ in range(k):
            batch = dict(zip(fields, data.next()))
            t0 = time.perf_counter()
            loss = train_step(m, opt, batch, *extra)
            out.append((time.perf_counter() - t0, float(loss)))
        return out
    return steps


def loop_data(batch: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The images and labels of the dataset the program's loop runs over: the first k batches that
    Batches(batch) draws."""
    data = Batches(batch)
    xs, ys = zip(*(data.next() for _ in range(k)))
    return torch.cat(xs), torch.cat(ys)


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
    img, label = loop_data(batch, k)
    dataset = ss.TensorDataset(img=img, label=label)
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


def round_trips(ss: Any, calls: int, several: str, one: str) -> dict[str, float]:
    """Median seconds of one call of `ident` from the controller: on the devices `several`, the pool's
    bare `ping` under it, and on the device `one` in this process (synchronized on a GPU)."""
    source = "fn ident(x: [n]) -> [n] = x\n"
    out = {}
    x = torch.zeros(2)
    for devices in (several, one):
        prog = ss.load(source, devices=devices)
        prog.ident(x)
        fns: dict[str, Callable[[], Any]] = {f"prog.ident on {devices}": synced(lambda: prog.ident(x),
                                                                                 prog.device.type)}
        if devices == several:
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
    ap.add_argument("--devices", default="cpu[0 1]",
                    help="the devices, as a program's devices line lists them (default: cpu[0 1]); "
                         "e.g. cpu[0 1 2], cuda[0 1], cuda[0 1 2 3]")
    args = ap.parse_args(argv)
    import shapescript as ss
    from shapescript.api import parse_devices

    try:
        device_set = parse_devices(args.devices)
    except ValueError as e:
        ap.error(f"--devices: {e}")
    if device_set.count < 2:
        ap.error(f"--devices {args.devices!r}: list two devices or more, e.g. 'cpu[0 1]' or 'cuda[0 1]'")
    kind, indices, world, devices = device_set.kind, device_set.indices or (), device_set.count, str(device_set)
    if kind == "cuda" and torch.cuda.device_count() <= max(indices):
        ap.error(f"--devices {devices} needs GPUs up to cuda:{max(indices)}, and torch {torch.__version__} sees "
                 f"{torch.cuda.device_count()} GPU(s)" + ("" if torch.version.cuda else " (a build without CUDA)"))
    one = "cpu" if kind == "cpu" else "cuda"  # the one-device reference, in this process (cuda: cuda:0)
    threads = rank_threads(kind, world)

    one_dev_threads = args.threads if args.threads is not None else torch.get_num_threads()
    load = os.getloadavg()[0]
    backend = "Gloo" if kind == "cpu" else "NCCL"
    gpus = "" if kind == "cpu" else "; " + ", ".join(f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in indices)
    print(f"devices {devices}: ShapeScript's {world} workers and torch DDP's {world} ranks, {backend}; "
          f"one device for reference: {one}{gpus}")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load {load:.2f}; torch {torch.__version__}; "
          f"python {platform.python_version()}; " + (
              f"{threads} torch thread(s) per worker and per rank, {one_dev_threads} for one device; "
              "subnormals kept (the workers can't be told to flush them)" if kind == "cpu" else
              f"{threads} torch thread(s) per rank, torch's default in the workers, {one_dev_threads} in this process"))

    runs = 1 if args.quick else 3
    colds = cold_starts(runs, devices)
    med = {k: statistics.median(c[k] for c in colds) for k in colds[0]}
    print(f"cold start on {devices}, median of {runs} fresh process(es): ss.load + Mlp.init {med['ready']:.3f} s "
          f"(pool cold_start_s {med['pool']:.3f} s); the first train_step after it {med['step'] * 1e3:.1f} ms")

    rtts = round_trips(ss, 200 if args.quick else 2000, devices, one)
    for label, t in rtts.items():
        print(f"round trip, {label}: {t * 1e6:.0f} us (median)")

    torch.set_num_threads(1)  # the draws of the batches here: no idle OpenMP threads spinning beside the race
    ddp = DdpRanks(threads, kind, indices)
    print(f"DDP ranks: spawned until the process group formed: {ddp.cold_start_s:.3f} s")
    # (batch, warmup pairs of blocks, blocks of each side, steps a block): each side runs fewer than the
    # ~700 steps after which AdamW's first moments of dead ReLU units reach the subnormal floats
    plan = [(64, 1, 10, 5), (6144, 1, 4, 2)] if args.quick else [(64, 2, 50, 10), (6144, 1, 40, 5)]
    prog2 = ss.load(PROGRAM, devices=devices)
    for batch, warmup, blocks, size in plan:
        m2 = prog2.Mlp.init(seed=0)
        opt2 = ss.adamw(m2, lr=LR)
        ddp.setup(batch, m2.w1, m2.w2, prog2.worker_source, kept=size)  # the module each worker runs
        progl = ss.load(loop_source(batch), devices=devices, name=f"mlp.ss with batches({batch})")
        ml = progl.Mlp.init(seed=0)
        sides = {
            "ShapeScript, prog.train_step(m, opt, batch dict)": timed_steps(prog2, m2, opt2, Batches(batch)),
            "DDP": ddp.steps("ddp"),
            "the generated code run in DDP's ranks": ddp.steps("generated"),
            "ShapeScript, the program's loop (prog.run)": timed_loop(progl, ml, ss.adamw(ml, lr=LR), batch, size),
            "DDP, its rows gathered from a kept dataset": ddp.steps(GATHERING),
        }
        times, rounds, worst = race(list(sides.values()), warmup, blocks, size)
        progl.stop()
        sub, total = ddp.subnormals()
        # one device, after the race, in this process, with its threads
        torch.set_num_threads(one_dev_threads)
        prog1 = ss.load(PROGRAM, devices=one)
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
        loop_k, gathering_k = len(sides) - 2, len(sides) - 1
        print(f"  the program's loop against DDP gathering its rows as the loop does: "
              f"{statistics.median(times[loop_k]) / statistics.median(times[gathering_k]):.3f} "
              f"(pair ratio {statistics.median(r[loop_k] / r[gathering_k] for r in rounds):.3f})")
        print(f"  {f'one device (devices={one}), after the race':<52} {statistics.median(ones) * 1e3:>7.3f} ms  "
              f"{statistics.median(ones) / ddp_median:>6.3f}  {'':>10}  ({quantiles(ones)})")
        parts = shares(batch, world)
        uneven = "" if len(set(parts)) == 1 else (
            f" (parts of {'/'.join(map(str, parts))}: DDP averages its ranks' mean gradients where ShapeScript counts "
            f"each example once, so their losses differ from the second step on)")
        print(f"  the first 3 losses of prog.train_step, DDP and the generated code in the ranks agree to "
              f"{worst:.1e}{uneven}; DDP's AdamW first moments subnormal at the end: {sub} of {total}", flush=True)
    ddp.stop()
    prog2.stop()

    # What sending a batch costs: a function of the program that only reads its batch (no collective,
    # a [b] result), on the devices against one device.
    source = PROGRAM.read_text() + "\nfn rows(batch: [b] Digit) -> [b] = sum(batch.img, over=D)\n"
    print("a call that only reads the batch, `fn rows(batch: [b] Digit) -> [b] = sum(batch.img, over=D)`, median:")
    for batch, calls in ((64, 50 if args.quick else 500), (6144, 10 if args.quick else 100)):
        x, y = Batches(batch).next()
        data = {"img": x, "label": y}
        row = []
        for on in (devices, one):
            prog = ss.load(source, devices=on, name="mlp.ss + rows")
            torch.set_num_threads(one_dev_threads if on == one else 1)
            rows = synced(prog.rows, prog.device.type)
            for _ in range(5):
                rows(data)
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                rows(data)
                times.append(time.perf_counter() - t0)
            row.append(statistics.median(times))
            prog.stop()
        mb = (x.numel() * x.element_size() + y.numel() * y.element_size()) / 2**20
        print(f"  batch {batch:>4} ({mb:.2f} MiB): {row[0] * 1e3:.3f} ms on {devices}, {row[1] * 1e3:.3f} ms on one device")
    part = shares(6144, world)[0] * (D * 4 + 8)
    print(f"  for comparison, a worker's {'half' if world == 2 else 'part'} of a batch of 6144 "
          f"({part / 2**20:.2f} MiB) through a bare socket pair to another process, and a 2-byte answer: "
          f"{socket_pair_time(part, 5 if args.quick else 30) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
