"""Where a call's round trip goes on several devices: three calls, in one run.

    python benchmarks/round_trip_parts.py            # cpu[0 1], about half a minute
    python benchmarks/round_trip_parts.py --quick    # a smoke test, not a figure

Timed from the controller, taking turns in blocks after a warmup (medians of every call):

- `prog.ident(x)` for `fn ident(x: [n]) -> [n] = x`: the whole call, every worker running it;
- the same call's message sent to every worker and their replies read, with none of the controller's
  own work around it (checking the arguments, making the message, the pool's bookkeeping, joining);
- that message sent to worker 0 alone, and its reply read: what the call would cost if only one
  worker ran it;
- `pool.call("ping", ())`: a message to every worker and their answers, running no program code.

The first less the second is the controller's own work a call; the second less the third, what a
second worker adds; the third less the fourth, roughly a `call`'s work on a worker beyond a ping's.
"""

from __future__ import annotations

import argparse
import select
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model

import shapescript as ss
from shapescript.parallel import spin
from shapescript.parallel.messages import Call, Reply, Status, wire
from shapescript.parallel.worker import dumps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default="cpu[0 1]")
    ap.add_argument("--quick", action="store_true", help="few calls: a smoke test, not a measurement")
    args = ap.parse_args(argv)
    rounds, calls = (2, 50) if args.quick else (6, 1000)
    prog = ss.load("fn ident(x: [n]) -> [n] = x\n", devices=args.devices, name="parts.ss")
    try:
        x = torch.arange(2.0)
        assert torch.equal(prog.ident(x), x)
        pool = prog.pool
        first = pool._workers[0]
        # The message RemoteFunction sends every worker for this call (unsplit: one for all).
        remote = prog.ident._py
        message = dumps(wire(Call("call", remote.where, remote._messages(pool, (x,)))))

        # Replies read as the pool reads them: polled for the pool's budget first (parallel/spin.py).
        pollers = []
        for w in pool._workers:
            pollers.append(select.poll())
            pollers[-1].register(w.conn.fileno(), select.POLLIN)

        def read(rank: int) -> Reply:
            spin.poll_briefly(pollers[rank], pool._spin)
            w = pool._workers[rank]
            return w.reply(w.conn.recv_bytes())

        def alone() -> None:
            first.conn.send_bytes(message)
            reply = read(0)
            assert reply.status == Status.OK and torch.equal(reply.value[0], x), reply

        def every() -> None:
            for w in pool._workers:
                w.conn.send_bytes(message)
            replies = [read(w.rank) for w in pool._workers]
            assert replies[0].status == Status.OK and torch.equal(replies[0].value[0], x), replies

        sides: dict[str, Callable[[], object]] = {
            "prog.ident, every worker": lambda: prog.ident(x),
            "its message to every worker": every,
            "its message to worker 0 alone": alone,
            "ping, every worker": lambda: pool.call("ping", ()),
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(-1, rounds):
            for name in (list(sides) if i % 2 == 0 else list(reversed(sides))):
                block = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    sides[name]()
                    block.append(time.perf_counter() - t0)
                if i >= 0:
                    times[name] += block
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        print(f"round trips on {args.devices}: {cpu_model()}, load {load}; {rounds} rounds of {calls} calls a side")
        for name, ts in times.items():
            print(f"  {name:32s} {statistics.median(ts) * 1e6:7.0f} µs")
    finally:
        prog.stop()


if __name__ == "__main__":
    main()
