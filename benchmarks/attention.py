"""ShapeScript against hand-written PyTorch: one training step of the attention example.

    python benchmarks/attention.py            # about a minute on 2 cores
    python benchmarks/attention.py --quick    # a few seconds, for a smoke test
    python benchmarks/attention.py --breakdown   # also: where the difference goes

The step: examples/attention/gpt.ss loaded with the small dims of examples/attention/train.py
(D = 64, H = 4, Dh = 16, F = 256, L = 2, T = 64; V = the characters of corpus.txt), batch 32,
AdamW with lr = 3e-3, in `ss.Eval` (dropout is the identity), called from Python as
`prog.train_step(m, opt, {"tokens": ..., "targets": ...}, ss.Eval)`, against the same model written
by hand (examples/attention/reference.py's HandGpt, same init) with torch.optim.AdamW(lr=3e-3):
loss.backward(), clip_grad_norm_(params, 1.0) (the program clips the gradient's norm to 1.0),
opt.step(), opt.zero_grad(). Both start from the same weights, see the same batch (windows of the
corpus), and run in one process with the same torch.set_num_threads; their steps alternate in ABBA
order after a warmup, and each figure is a median. The ratio is ShapeScript / PyTorch.

--breakdown times, against the same hand loop, the generated code alone (a ready ss.Batch, no
argument checks) and hand-written variants that each copy one thing the generated code does
differently, to say where the difference goes.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "examples" / "attention"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import cpu_model  # noqa: E402  (benchmarks/common.py)
from reference import HandGpt  # noqa: E402  (examples/attention/reference.py)

import shapescript as ss  # noqa: E402
from shapescript import std  # noqa: E402
from shapescript.api import Program, compile_program  # noqa: E402

PROGRAM = ROOT / "examples" / "attention" / "gpt.ss"
CORPUS = ROOT / "examples" / "attention" / "corpus.txt"
SMALL = {"D": 64, "H": 4, "Dh": 16, "F": 256, "L": 2}  # examples/attention/train.py's dims
T = 64
BATCH = 32
LR = 3e-3
CLIP = 1.0


class Hand:
    """HandGpt with the program's training step: backward, clip the norm to 1.0, AdamW."""

    def __init__(self, V: int, seed: int, model: type[HandGpt] = HandGpt) -> None:
        self.model = model(V, T, SMALL["D"], SMALL["H"], SMALL["Dh"], SMALL["F"], SMALL["L"], seed)
        self.params = list(self.model.parameters())
        self.opt = torch.optim.AdamW(self.params, lr=LR)

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = self.model.loss(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, CLIP)
        self.opt.step()
        self.opt.zero_grad()
        return loss.detach()


# -- hand-written variants for --breakdown: each copies one thing the generated code does --------

class HandExternNorm(HandGpt):
    """Layer norm as the unfused program calls it: the built-in `layer_norm` through the run time's
    `_rt.layer_norm` (the fused program gives it the gain and bias: one kernel)."""

    norm: Callable[[torch.Tensor], torch.Tensor]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, n = tokens.shape
        norm = self.norm
        x = F.embedding(tokens, self.emb) + self.pos
        mask = torch.ones(n, n, dtype=torch.bool, device=tokens.device).triu(1)
        for blk in self.blocks:
            h = norm(x) * blk.g1 + blk.b1
            q, k, v = (h @ blk.w_qkv).view(b, n, 3, self.H, self.Dh).permute(2, 0, 3, 1, 4)
            s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.Dh))
            a = torch.softmax(s.masked_fill(mask, -1e9), dim=-1)
            o = (a @ v).permute(0, 2, 1, 3).reshape(b, n, self.H * self.Dh)
            x = x + o @ blk.w_o
            h = norm(x) * blk.g2 + blk.b2
            x = x + F.gelu(h @ blk.w1 + blk.c1) @ blk.w2 + blk.c2
        return (norm(x) * self.gf + self.bf) @ self.head


class HandEinsum(HandGpt):
    """Attention's two products as the program writes them: torch.einsum, not @."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, n = tokens.shape
        x = F.embedding(tokens, self.emb) + self.pos
        mask = torch.ones(n, n, dtype=torch.bool, device=tokens.device).triu(1)
        for blk in self.blocks:
            h = F.layer_norm(x, (x.shape[-1],)) * blk.g1 + blk.b1
            q, k, v = (h @ blk.w_qkv).view(b, n, 3, self.H, self.Dh).permute(2, 0, 3, 1, 4)
            s = torch.einsum("abcd,abed->abce", q, k) * (1.0 / math.sqrt(self.Dh))
            a = torch.softmax(s.masked_fill(mask, -1e9), dim=-1)
            o = torch.einsum("abcd,abde->abce", a, v).permute(0, 2, 1, 3).reshape(b, n, self.H * self.Dh)
            x = x + o @ blk.w_o
            h = F.layer_norm(x, (x.shape[-1],)) * blk.g2 + blk.b2
            x = x + F.gelu(h @ blk.w1 + blk.c1) @ blk.w2 + blk.c2
        return (F.layer_norm(x, (x.shape[-1],)) * self.gf + self.bf) @ self.head


class HandAsProgram(HandGpt):
    """All of the program's choices at once: the run time's layer_norm call, einsum, a causal mask made
    for each attention (with HandGradClip's step)."""

    norm: Callable[[torch.Tensor], torch.Tensor]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, n = tokens.shape
        norm = self.norm
        x = F.embedding(tokens, self.emb) + self.pos
        for blk in self.blocks:
            h = norm(x) * blk.g1 + blk.b1
            q, k, v = (h @ blk.w_qkv).view(b, n, 3, self.H, self.Dh).permute(2, 0, 3, 1, 4)
            s = torch.einsum("abcd,abed->abce", q, k) * (1.0 / math.sqrt(self.Dh))
            mask = torch.ones(n, n, dtype=torch.bool, device=tokens.device).triu(1)
            a = torch.softmax(s.masked_fill(mask, -1e9), dim=-1)
            o = torch.einsum("abcd,abde->abce", a, v).permute(0, 2, 1, 3).reshape(b, n, self.H * self.Dh)
            x = x + o @ blk.w_o
            h = norm(x) * blk.g2 + blk.b2
            x = x + F.gelu(h @ blk.w1 + blk.c1) @ blk.w2 + blk.c2
        return (norm(x) * self.gf + self.bf) @ self.head


class HandGradClip(Hand):
    """The program's step shape: torch.autograd.grad, then new clipped tensors (t * scale, as
    _rt.clip_norm does) assigned as .grad, opt.step(), grads set to None."""

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            loss = self.model.loss(tokens, targets)
            grads = torch.autograd.grad(loss, self.params)
        total = torch.nn.utils.get_total_norm(grads)
        scale = torch.clamp(CLIP / (total + 1e-6), max=1.0)
        for p, g in zip(self.params, grads):
            p.grad = g * scale
        self.opt.step()
        for p in self.params:
            p.grad = None
        return loss.detach()


# -- timing --------------------------------------------------------------------------------------

def corpus_ids() -> tuple[torch.Tensor, int]:
    text = CORPUS.read_text()
    vocab = sorted(set(text))
    index = {ch: k for k, ch in enumerate(vocab)}
    return torch.tensor([index[ch] for ch in text]), len(vocab)


def race(a: Callable[[torch.Tensor, torch.Tensor], object], b: Callable[[torch.Tensor, torch.Tensor], object],
         fresh: Callable[[], tuple[torch.Tensor, torch.Tensor]], warmup: int, reps: int
         ) -> tuple[float, float, float]:
    """(median of a's steps, median of b's, median of the per-pair ratios a / b), seconds: the two
    alternate in ABBA order on the same fresh batch for each pair, after `warmup` pairs."""

    def timed(f: Callable[[torch.Tensor, torch.Tensor], object], x: torch.Tensor, y: torch.Tensor) -> float:
        t0 = time.perf_counter()
        f(x, y)
        return time.perf_counter() - t0

    for _ in range(warmup):
        x, y = fresh()
        timed(a, x, y)
        timed(b, x, y)
    a_times, b_times = [], []
    for i in range(reps):
        x, y = fresh()
        if i % 2 == 0:
            a_times.append(timed(a, x, y))
            b_times.append(timed(b, x, y))
        else:
            b_times.append(timed(b, x, y))
            a_times.append(timed(a, x, y))
    ratios = [s / t for s, t in zip(a_times, b_times)]
    return statistics.median(a_times), statistics.median(b_times), statistics.median(ratios)


class Setup:
    """The program, a model and its optimizer, the corpus and a batch sampler."""

    def __init__(self, seed: int = 0) -> None:
        self.ids, self.V = corpus_ids()
        self.prog = ss.load(PROGRAM, dims={"V": self.V, **SMALL})
        # The same program without ir/fuse.py's rewrites (torch's attention and layer_norm kernels,
        # one causal mask per size): what the generated code was before them, to race against.
        checked = compile_program(PROGRAM.read_text(), str(PROGRAM), None, {"V": self.V, **SMALL})
        self.unfused = Program(checked, fused=False)
        self.g = torch.Generator().manual_seed(seed)

    def fresh(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A new batch of windows of the corpus: tokens and their successors (drawn outside the timing)."""
        starts = torch.randint(0, len(self.ids) - T - 1, (BATCH,), generator=self.g)
        rows = self.ids[starts[:, None] + torch.arange(T + 1)]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def ss_step(self, generated: bool = False, fused: bool = True) -> Callable[[torch.Tensor, torch.Tensor], object]:
        prog = self.prog if fused else self.unfused
        m = prog.Gpt.init(seed=0)
        opt = ss.adamw(m, lr=LR)
        if generated:
            raw, spec = prog.namespace["train_step"], prog.Text

            def step(x: torch.Tensor, y: torch.Tensor) -> object:
                grad_was = torch.is_grad_enabled()
                torch._C._set_grad_enabled(False)  # as prog.train_step does around the generated code
                try:
                    return raw(m, opt, ss.Batch(spec, {"tokens": x, "targets": y}), ss.Eval)
                finally:
                    torch._C._set_grad_enabled(grad_was)
        else:
            train_step = prog.train_step

            def step(x: torch.Tensor, y: torch.Tensor) -> object:
                return train_step(m, opt, {"tokens": x, "targets": y}, ss.Eval)
        return step


def check_same(setup: Setup) -> float:
    """The first steps' losses of both sides on the same batches: the largest difference. Both start
    from the same weights, so they agree to rounding."""
    ss_step, hand = setup.ss_step(), Hand(setup.V, seed=0)
    worst = 0.0
    for _ in range(3):
        x, y = setup.fresh()
        worst = max(worst, abs(float(ss_step(x, y)) - float(hand.step(x, y))))
    return worst


def per_call(f: Callable[[], object], g: Callable[[], object], reps: int) -> tuple[float, float]:
    """Medians of f() and g(), alternating, seconds."""
    fs, gs = [], []
    for i in range(reps + reps // 10):
        for h, out in ((f, fs), (g, gs)) if i % 2 == 0 else ((g, gs), (f, fs)):
            t0 = time.perf_counter()
            h()
            out.append(time.perf_counter() - t0)
    return statistics.median(fs[reps // 10:]), statistics.median(gs[reps // 10:])


def per_call_costs(setup: Setup, reps: int) -> list[tuple[str, int, float, float]]:
    """(what, times per step, the program's way, the hand's way) for each thing the generated code
    does differently, timed call by call on this model's shapes."""
    from shapescript.runtime import core as rt
    g = torch.Generator().manual_seed(1)
    b, H, Dh, D = BATCH, SMALL["H"], SMALL["Dh"], SMALL["D"]
    x = torch.randn(b, T, D, generator=g)
    q, k, v = (torch.randn(b, H, T, Dh, generator=g) for _ in range(3))
    s = torch.randn(b, H, T, T, generator=g)
    m = setup.prog.Gpt.init(seed=0)
    grads = [torch.randn(p.shape, generator=g) for p in m.params()]
    params = [torch.zeros(p.shape, requires_grad=True) for p in m.params()]
    tokens, targets = setup.fresh()
    fn = setup.prog.train_step  # its checks of the arguments, without the call
    opt = ss.adamw(m, lr=LR)
    values = [m, opt, {"tokens": tokens, "targets": targets}, ss.Eval]

    def checks() -> object:
        bindings: dict = {}
        return [guard(value, bindings) for guard, value in zip(fn._guards, values)]

    def hand_clip() -> object:
        for p, t in zip(params, grads):
            p.grad = t
        return torch.nn.utils.clip_grad_norm_(params, CLIP)

    qg, kg, vg, sg = (t.clone().requires_grad_() for t in (q, k, v, s))
    go_s, go_o = torch.randn(b, H, T, T, generator=g), torch.randn(b, H, T, Dh, generator=g)

    def backward(out: torch.Tensor, grad: torch.Tensor) -> None:
        torch.autograd.grad(out, out_inputs(out), grad)

    def out_inputs(out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (qg, kg) if out.shape[-1] == T else (sg, vg)

    rows = [
        ("layer_norm call (the run time's _rt.layer_norm)", 5,
         lambda: rt.layer_norm(x, 2, None, None, 1e-5), lambda: F.layer_norm(x, (D,))),
        ("q k product, einsum against @, forward", 2,
         lambda: torch.einsum("abcd,abed->abce", q, k), lambda: q @ k.transpose(-1, -2)),
        ("a v product, einsum against @, forward", 2,
         lambda: torch.einsum("abcd,abde->abce", s, v), lambda: s @ v),
        ("q k product, einsum against @, forward + backward", 2,
         lambda: backward(torch.einsum("abcd,abed->abce", qg, kg), go_s),
         lambda: backward(qg @ kg.transpose(-1, -2), go_s)),
        ("a v product, einsum against @, forward + backward", 2,
         lambda: backward(torch.einsum("abcd,abde->abce", sg, vg), go_o), lambda: backward(sg @ vg, go_o)),
        ("causal mask, made per attention (2) against per step (1)", 1,
         lambda: (rt.causal(T, T, "cpu"), rt.causal(T, T, "cpu")),
         lambda: torch.ones(T, T, dtype=torch.bool).triu(1)),
        ("clip_norm (t * scale) against clip_grad_norm_", 1,
         lambda: rt.clip_norm(rt.Grads(m.spec, grads), CLIP), hand_clip),
        ("checks of prog.train_step's arguments", 1, checks, lambda: None),
    ]
    return [(what, n, *per_call(f, h, reps)) for what, n, f, h in rows]


def profile(setup: Setup, steps: int) -> None:
    """torch.profiler's table of each side's steps: CPU time by operator, self and total."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    for name, f in (("ShapeScript", setup.ss_step()), ("PyTorch", Hand(setup.V, seed=0).step)):
        batches = [setup.fresh() for _ in range(steps + 10)]
        for x, y in batches[:10]:
            f(x, y)
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for x, y in batches[10:]:
                f(x, y)
        print(f"--- {name}: {steps} steps, by total CPU time")
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions: a smoke test, not a measurement")
    ap.add_argument("--breakdown", action="store_true",
                    help="also the generated code alone and hand-written variants that copy one of its choices")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="also print torch.profiler's operator table of STEPS steps of each side")
    ap.add_argument("--keep-subnormals", action="store_true", help="don't flush subnormal floats to zero")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads for both sides (default: torch's own default)")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    flush = not args.keep_subnormals and torch.set_flush_denormal(True)  # as benchmarks/step.py
    setup = Setup()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load {load:.2f}; torch {torch.__version__}, "
          f"{threads} thread{'s' if threads != 1 else ''}; python {platform.python_version()}; subnormals "
          f"{'flushed to zero' if flush else 'kept'}")
    print(f"gpt.ss with V={setup.V} D={SMALL['D']} H={SMALL['H']} Dh={SMALL['Dh']} F={SMALL['F']} "
          f"L={SMALL['L']} T={T}, batch {BATCH}, AdamW lr {LR}, Eval; "
          f"largest difference of the first 3 losses: {check_same(setup):.2e}")
    warmup, reps = (5, 40) if args.quick else (50, 600)
    print(f"{'':<34}  {'this':>10}  {'PyTorch':>10}  {'ratio':>6}  {'pair ratio':>10}  steps")

    def row(label: str, a: Callable[[torch.Tensor, torch.Tensor], object], hand: Hand) -> None:
        s, t, r = race(a, hand.step, setup.fresh, warmup, reps)
        print(f"{label:<34}  {s * 1e3:>7.3f} ms  {t * 1e3:>7.3f} ms  {s / t:>6.3f}  {r:>10.3f}  {reps}", flush=True)

    row("ShapeScript prog.train_step", setup.ss_step(), Hand(setup.V, seed=0))
    row("ShapeScript, not fused", setup.ss_step(fused=False), Hand(setup.V, seed=0))
    s, t, r = race(setup.ss_step(), setup.ss_step(fused=False), setup.fresh, warmup, reps)
    print(f"{'fused / not fused':<34}  {s * 1e3:>7.3f} ms  {t * 1e3:>7.3f} ms  {s / t:>6.3f}  {r:>10.3f}  {reps}"
          f"  (the second column: not fused)", flush=True)
    if args.breakdown:
        row("generated code alone", setup.ss_step(generated=True), Hand(setup.V, seed=0))
        from shapescript.runtime import core as rt
        called = staticmethod(lambda x: rt.layer_norm(x, 2, None, None, 1e-5))  # the unfused generated call
        HandExternNorm.norm = HandAsProgram.norm = called  # type: ignore[assignment]
        row("hand + _rt.layer_norm call", Hand(setup.V, 0, HandExternNorm).step, Hand(setup.V, seed=0))
        plain = type("HandStdNorm", (HandExternNorm,), {"norm": staticmethod(lambda x: std.layer_norm(x, 2))})
        row("hand + std.layer_norm, no call", Hand(setup.V, 0, plain).step, Hand(setup.V, seed=0))
        row("hand + einsum in attention", Hand(setup.V, 0, HandEinsum).step, Hand(setup.V, seed=0))
        row("hand + autograd.grad, t * scale", HandGradClip(setup.V, 0).step, Hand(setup.V, seed=0))
        row("hand + all of these", HandGradClip(setup.V, 0, HandAsProgram).step, Hand(setup.V, seed=0))
        print("call by call (medians of this and the hand's way; x: times a step):")
        total = 0.0
        for what, n, a, h in per_call_costs(setup, 200 if args.quick else 2000):
            if not what.endswith(", forward"):  # the forward-only rows are part of the next ones
                total += n * (a - h)
            print(f"  {what:<54} {a * 1e6:>8.1f} us  {h * 1e6:>8.1f} us  x{n}: {n * (a - h) * 1e6:>+7.1f} us a step")
        print(f"  {'sum (the forward-only rows left out)':<54} {'':>22}      {total * 1e6:>+7.1f} us a step")
    if args.profile:
        profile(setup, args.profile)


if __name__ == "__main__":
    main()
