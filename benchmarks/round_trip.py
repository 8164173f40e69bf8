"""A call's round trip on several devices, before the round trips were cut and after, side by side
in one run.

    python benchmarks/round_trip.py                   # cpu[0 1], against commit ef5b030: about a minute
    python benchmarks/round_trip.py --against REV     # against another commit of this repository
    python benchmarks/round_trip.py --quick           # a smoke test, not a figure

Two sides, each a controller process of its own with its own workers and its own sys.path: the
baseline (the tree of `--against`, extracted with `git archive` into a temporary folder) and this
working tree. Each runs, from the controller, the calls below; the sides take turns in blocks (A B,
then B A, ...) after a warmup, so both see the same load of a noisy machine. Each figure is the
median of a side's calls; the ratio is this tree's median over the baseline's, and the pair ratio the
median of the rounds' ratios.

- `prog.ident(torch.zeros(2))` for `fn ident(x: [n]) -> [n] = x`: an unsplit call, a whole result
  (benchmarks/several.py's round trip);
- `pool.call("ping", ())`: the pool's bare message to every worker and their answers;
- `prog.rows(batch)` for `fn rows(batch: [b] Row) -> [b] = sum(batch.x, over=D)` on a batch of 8
  rows of 4 values from Python: a split call whose result is joined from every worker's part.

With `--apart`, only one side is alive at a time: each round starts a fresh controller (and its
workers) for each side in turn, runs a block of each call, and stops it. On 2 cores the other side's
idle processes, though they wait on their sockets, made every round trip several times slower
(once measured: `ping` 443 µs side by side against 138 µs apart), so apart is the fairer figure there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import cpu_model  # noqa: E402  (benchmarks/common.py)

BASELINE = "ef5b030"  # the commit before the round trips were cut

SOURCE = """\
dim D = 4

data Row:
    x: [D]

fn ident(x: [n]) -> [n] = x

fn rows(batch: [b] Row) -> [b] = sum(batch.x, over=D)
"""

# A side's controller: loads the program, then runs each block it is asked for ("ident 500") and
# answers the calls' times in ns, one JSON line a block.
_SIDE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
import shapescript as ss
prog = ss.load(sys.argv[2], devices=sys.argv[3], name="round_trip.ss")
x = torch.zeros(2)
batch = {"x": torch.arange(32.0).reshape(8, 4)}
prog.ident(x)
calls = {"ident": lambda: prog.ident(x), "ping": lambda: prog._pool.call("ping", ()),
         "rows": lambda: prog.rows(batch)}
assert torch.equal(prog.rows(batch), batch["x"].sum(1)) and torch.equal(prog.ident(x), x)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    what, n = line.split()
    f, times = calls[what], []
    for _ in range(int(n)):
        t0 = time.perf_counter_ns()
        f()
        times.append(time.perf_counter_ns() - t0)
    print(json.dumps(times), flush=True)
prog.stop()
"""


class Side:
    """A controller process on the tree at `root`, with its workers, taking blocks of calls."""

    def __init__(self, label: str, root: str, devices: str) -> None:
        self.label = label
        env = dict(os.environ, PYTHONPATH=root)  # its workers import from the controller's sys.path
        self.proc = subprocess.Popen([sys.executable, "-c", _SIDE, root, SOURCE, devices], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=root)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        assert json.loads(self.stdout.readline()) == {"ready": True}, f"the {label} side didn't start"

    def block(self, what: str, calls: int) -> list[float]:
        """Seconds of each of `calls` calls."""
        self.stdin.write(f"{what} {calls}\n")
        self.stdin.flush()
        return [t / 1e9 for t in json.loads(self.stdout.readline())]

    def stop(self) -> None:
        self.stdin.close()
        self.proc.wait(30)


def extract(rev: str, into: str) -> str:
    """The tree of commit `rev` of this repository, written under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def race(sides: list[Side], what: str, warmup: int, rounds: int, calls: int) -> tuple[list[list[float]], list[float]]:
    """Each side's call times, and each round's ratio of the second side's median to the first's."""
    times: list[list[float]] = [[] for _ in sides]
    ratios = []
    for i in range(-warmup, rounds):
        order = range(len(sides)) if i % 2 == 0 else reversed(range(len(sides)))
        block = {k: sides[k].block(what, calls) for k in order}
        if i >= 0:
            for k, ts in block.items():
                times[k] += ts
            ratios.append(statistics.median(block[1]) / statistics.median(block[0]))
    return times, ratios


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", default=BASELINE, help=f"the baseline commit (default {BASELINE})")
    ap.add_argument("--devices", default="cpu[0 1]", help="the devices (default cpu[0 1])")
    ap.add_argument("--quick", action="store_true", help="few calls: a smoke test, not a measurement")
    ap.add_argument("--apart", action="store_true",
                    help="one side alive at a time: a fresh controller a side each round")
    args = ap.parse_args(argv)
    rounds, calls = (4, 100) if args.quick else ((6, 1000) if args.apart else (12, 400))
    print(f"round trips on {args.devices}: {args.against} against this tree{', apart' if args.apart else ''}; "
          f"{cpu_model()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {rounds} rounds of {calls} calls "
          f"a side, medians")
    print(f"  {'call':<10} {args.against:>10} {'this tree':>10} {'ratio':>6} {'pair ratio':>10}")
    with tempfile.TemporaryDirectory(prefix="round-trip-base-") as folder:
        roots = [(args.against, extract(args.against, folder)), ("this tree", str(ROOT))]
        results = apart(roots, args.devices, rounds, calls) if args.apart else together(roots, args.devices, rounds, calls)
    for what, (times, ratios) in results.items():
        base, now = (statistics.median(t) for t in times)
        print(f"  {what:<10} {base * 1e6:>7.0f} µs {now * 1e6:>7.0f} µs {now / base:>6.2f} "
              f"{statistics.median(ratios):>10.2f}", flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")


CALLS = ("ident", "ping", "rows")
Results = dict[str, tuple[list[list[float]], list[float]]]  # by call: each side's times, each round's ratio


def together(roots: list[tuple[str, str]], devices: str, rounds: int, calls: int) -> Results:
    """Both sides alive throughout, taking turns block by block."""
    sides = [Side(label, root, devices) for label, root in roots]
    try:
        return {what: race(sides, what, 1, rounds, calls) for what in CALLS}
    finally:
        for side in sides:
            side.stop()


def apart(roots: list[tuple[str, str]], devices: str, rounds: int, calls: int) -> Results:
    """One side alive at a time: each round, each side (in turns' order) starts, warms up, runs a
    block of each call and stops."""
    out: Results = {what: ([[] for _ in roots], []) for what in CALLS}
    for i in range(rounds):
        medians: dict[str, dict[int, float]] = {what: {} for what in CALLS}
        for k in (range(len(roots)) if i % 2 == 0 else reversed(range(len(roots)))):
            side = Side(*roots[k], devices)
            try:
                for what in CALLS:
                    side.block(what, calls // 5)  # warm-up
                    times = side.block(what, calls)
                    out[what][0][k] += times
                    medians[what][k] = statistics.median(times)
            finally:
                side.stop()
        for what in CALLS:
            out[what][1].append(medians[what][1] / medians[what][0])
    return out


if __name__ == "__main__":
    main()
