"""Small ShapeScript programs the tests share (imported as `programs`, as `support` is): the headers
that several test files repeat, the examples' programs as the tests read them, and the programs the
per-pass tests (tests/passes/) compile. Each is a named source string; a test that changes one does
so with `.replace` on its own copy, or by adding functions after it."""

from __future__ import annotations

import textwrap
from typing import Any

from support import ROOT

# -- headers ---------------------------------------------------------------------------------------

# A linear classifier's dims, example and model: the start of most small programs with a batch.
LIN_HEADER = textwrap.dedent("""\
    dim D = 4
    dim C = 3

    data Ex:
        x: [D]
        y: [] Index[C]

    model Lin:
        param w: [D C] = normal(std=0.1)
    """)

# Its loss, with the scores written out.
LIN_LOSS = "fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(batch.x @ m.w, batch.y, over=C)\n"

# Its training step (value_and_grad and update of an AdamW), after a `loss(m: Lin, batch: [b] Ex)`.
LIN_STEP = textwrap.dedent("""\
    fn step(mut m: Lin, mut opt: AdamW[Lin], batch: [b] Ex) -> []:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l
    """)

# A net with an H axis (after dims D, H, C and an Ex): under `split H` its softmax along H gathers
# the scores whole and cuts them again (its gradient is reduce-scattered), and its last matmul sums
# the devices' parts.
HEADS_NET = textwrap.dedent("""\
    model Net:
        param w: [D H] = normal(std=0.5)
        param v: [H C] = normal(std=0.5)

    fn scores(m: Net, x: [b D]) -> [b C] = softmax(x @ m.w, over=H) @ m.v
    """)
# What HEADS_NET needs before it, with `split H` (on one device until devices are given).
HEADS_HEADER = textwrap.dedent("""\
    devices cpu
        split H

    dim D = 6
    dim H = 6
    dim C = 3

    data Ex:
        x: [D]
        y: [] Index[C]

    """)

# A small program on several devices: a linear classifier, its step and a loop over a dataset.
LINEAR = LIN_HEADER + textwrap.dedent("""\

    fn scores(m: Lin, x: [b D]) -> [b C] = x @ m.w

    fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(scores(m, batch.x), batch.y, over=C)

    """) + LIN_STEP + textwrap.dedent("""\

    fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink):
        for batch in data |> shuffle(seed=1) |> batches(8):
            write(log, logs(loss=step(mut m, mut opt, batch)))
    """)



def epochs_of(passes: int, eval_batch: int) -> str:
    """Two fns to add after LINEAR's (or a program with its `fit` and `loss`): `total_loss`, a loop in
    batches of `eval_batch`, and `epochs`, `passes` calls of `fit` (passes of its loop) and then
    total_loss: a program with two loops, one run several times in a call."""
    fits = "\n    ".join(["fit(mut m, mut opt, data, log)"] * passes)
    return textwrap.dedent(f"""
        fn total_loss(m: Lin, data: Dataset[Ex]) -> []:
            total = to(0.0, f32)
            for batch in data |> batches({eval_batch}):
                total = total + loss(m, batch)
            return total
        """) + f"\nfn epochs(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink) -> []:\n    {fits}\n" \
        "    return total_loss(m, data)\n"


# -- the examples ------------------------------------------------------------------------------------

README_FILE = ROOT / "examples" / "readme" / "mlp.ss"
README = README_FILE.read_text()  # the README's MLP, with its `devices cuda[0 1 2]` line


# `precision mixed f16` (tests/compiler/test_mixed_precision.py and its several-devices twin): the README
# MLP with its loss times 100, whose scaled backward overflows f16 at the first steps (the loss scale
# starts at 2^16), so that updates are skipped and the scale halved until it fits.
F16_OVERFLOWING = ("precision mixed f16\n\n" + README.replace("devices cuda[0 1 2]\n", "")).replace(
    "return cross_entropy(forward(m, batch.img), batch.label, over=C)",
    "return cross_entropy(forward(m, batch.img), batch.label, over=C) * 100.0")


def readme_program() -> str:
    """The README's program: its ```ss block, which the README's script loads as mlp.ss (README holds
    it, with its `devices` line and more)."""
    return (ROOT / "README.md").read_text().split("\n```ss\n", 1)[1].split("```")[0]


GPT_FILE = ROOT / "examples" / "attention" / "gpt.ss"
GPT = GPT_FILE.read_text()
NANOGPT = (ROOT / "examples" / "nanogpt" / "gpt.ss").read_text()  # nanoGPT in ShapeScript

# `layout auto` (tests/compiler/test_layout_auto.py, tests/several/test_layout_auto_several.py): the
# attention example in f64 (its runs compare with one device's within 1e-5, which AdamW's first steps
# on a model this wide don't keep in f32 even as plain data parallel) with a wide feed-forward layer,
# where on 3 devices `split F` sends the fewest bytes a step (its MLP's gradients stay each device's
# own) and data parallel the next fewest.
WIDE_GPT = "precision f64\n\n" + GPT.replace("to(0.0, f32)", "to(0.0, f64)")
WIDE_GPT_DIMS = {"V": 11, "T": 8, "D": 24, "H": 3, "Dh": 8, "F": 1536, "L": 2}
# Budgets and the layout each gets (the costs, from the table at the batch of `batches(32)`: split F
# holds 10.0 MiB a device, split F + shard params 9.90 MiB, shard params 8.37 MiB, the least).
AUTO_BUDGETS = {"12 MiB": "split F", "10 MiB": "split F + shard params", "9 MiB": "shard params"}


# nanoGPT (examples/nanogpt) at two sizes, H dividing by 3
NANO_SMALL = {"V": 65, "T": 16, "H": 3, "Dh": 8, "L": 2, "M": 2, "New": 4, "TopK": 5}
NANO_LARGER = {"V": 65, "T": 32, "H": 6, "Dh": 16, "L": 3, "M": 2, "New": 4, "TopK": 5}


def auto_layout(source: str, budget: str | None = None, devices: str = "cpu[0 1 2]") -> str:
    """`source` under a devices line with `layout auto` (and `memory budget`)."""
    return f"devices {devices}\n    layout auto\n" + (f"    memory {budget}\n" if budget else "") + "\n" + source
GPT_DIMS = {"V": 11, "T": 8, "D": 16, "H": 2, "Dh": 8, "F": 32, "L": 2}  # tiny: for runs on several devices

# batch_norm's statistics in a model of their own, between two layers.
BATCH_NORM = textwrap.dedent("""\
    dim D = 6
    dim Hd = 8
    dim C = 3

    data Ex:
        x: [D]
        y: [] Index[C]

    model Stats:
        buffer mean: [Hd] = zeros()
        buffer var: [Hd] = ones()

    model Net:
        param w1: [D Hd] = normal(std=0.3)
        norm: Stats
        param w2: [Hd C] = normal(std=0.3)

    fn loss(m: Net, batch: [b] Ex, mode: Mode) -> []:
        h = relu(batch_norm(batch.x @ m.w1, m.norm, mode, over=Hd))
        return cross_entropy(h @ m.w2, batch.y, over=C)

    fn train_step(mut m: Net, mut opt: AdamW[Net], batch: [b] Ex, mode: Mode) -> []:
        l, g = value_and_grad(loss, m, batch, mode)
        update(mut m, mut opt, g)
        return l
    """)

# -- for the run time's tests --------------------------------------------------------------------

# A one-device cuda program with functions whose steps a cuda device may record (device work only:
# logits, loss, step) and functions it may not (a Mode, an extern fn, directly or through a callee; a
# loop and a sink): runtime/recorded.py's RECORDABLE table (tests/runtime/test_recorded*.py).
CUDA_NET = """
devices cuda[0]
dim D = 8
dim C = 3

data Ex:
    x: [D]
    y: [] Index[C]

model Net:
    param w: [D C] = normal(std=0.1)

extern fn ln(x: [b D], over: Axis[D]) -> [b D] = "shapescript.std.layer_norm"

fn logits(m: Net, x: [b D]) -> [b C] = x @ m.w
fn noisy(m: Net, x: [b D], mode: Mode) -> [b C] = dropout(x @ m.w, 0.1, mode)
fn normed(m: Net, x: [b D]) -> [b C] = ln(x, over=D) @ m.w
fn calls_noisy(m: Net, x: [b D]) -> [b C] = noisy(m, x, Eval())
fn calls_normed(m: Net, x: [b D]) -> [b C] = normed(m, x) * 2.0

fn loss(m: Net, batch: [b] Ex) -> [] = cross_entropy(logits(m, batch.x), batch.y, over=C)

fn step(mut m: Net, mut opt: AdamW[Net], batch: [b] Ex) -> []:
    l, g = value_and_grad(loss, m, batch)
    update(mut m, mut opt, g)
    return l

fn run(mut m: Net, mut opt: AdamW[Net], data: Dataset[Ex], log: Sink):
    for batch in data |> batches(4):
        write(log, logs(loss=step(mut m, mut opt, batch)))
"""

# -- for the per-pass tests ------------------------------------------------------------------------

# One function for each of the manual's reasons to run in the controller, on the workers or anywhere
# (plan/placement.py), after LIN_HEADER.
PLACES = LIN_HEADER + textwrap.dedent("""\

    python fn helper_matrix() -> [D C] = "helper_mod.ones_matrix"

    extern fn ln(x: [b D], over: Axis[D]) -> [b D] = "shapescript.std.layer_norm"

    fn twice(n: int) -> int = n * 2

    fn scores(m: Lin, x: [b D]) -> [b C] = x @ m.w

    fn normed(x: [b D]) -> [b D] = ln(x, over=D)

    fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(scores(m, batch.x), batch.y, over=C)

    """) + LIN_STEP + textwrap.dedent("""\

    fn show(x: []):
        print(x)

    fn show_twice(x: []):
        show(x)
        show(x)

    fn show_through(x: []):
        show_twice(x)

    fn keep(path: str, m: Lin):
        save(path, m)

    fn restore(path: str, mut m: Lin):
        load(path, mut m)

    fn record(log: Sink, x: []):
        write(log, logs(x=x))

    fn with_helper(x: [b D]) -> [b C] = x @ helper_matrix()

    fn count(data: Dataset[Ex]) -> int = twice(1)

    fn to_sink(log: Sink) -> int = twice(2)

    fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink):
        for batch in data |> batches(8):
            write(log, logs(loss=step(mut m, mut opt, batch)))
    """)

# Device work in a function that runs in the controller (E1803 on several devices), three ways: a step
# that prints, a step that calls a function that prints, and a loop that trains in its own body.
PRINTING_STEP = LIN_HEADER + "\n" + LIN_LOSS + "\n" + textwrap.dedent("""\
    fn step(mut m: Lin, mut opt: AdamW[Lin], batch: [b] Ex) -> []:
        l, g = value_and_grad(loss, m, batch)
        print(l)
        update(mut m, mut opt, g)
        return l
    """)

SHOWING_STEP = LIN_HEADER + "\n" + LIN_LOSS + "\n" + textwrap.dedent("""\
    fn show(x: []):
        print(x)

    fn step(mut m: Lin, mut opt: AdamW[Lin], batch: [b] Ex) -> []:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        show(l)
        return l
    """)

TRAINING_LOOP = LIN_HEADER + "\n" + LIN_LOSS + "\n" + textwrap.dedent("""\
    fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex]):
        for batch in data |> batches(4):
            l, g = value_and_grad(loss, m, batch)
            update(mut m, mut opt, g)
    """)

# Operations on a split batch: some combine across the devices (sum, mean, cross_entropy, and the
# contractions over the batch axis: `@`, einsum, reduce with sum), some work on each example alone.
SPLIT_OPS = LIN_HEADER + textwrap.dedent("""\

    fn total(batch: [b] Ex) -> [D] = sum(batch.x, over=b)
    fn average(batch: [b] Ex) -> [D] = mean(batch.x, over=b)
    fn overall(batch: [b] Ex) -> [] = mean(batch.x)
    fn per_example(batch: [b] Ex) -> [b] = sum(batch.x, over=D)
    fn gram(batch: [b] Ex) -> [D D] = rearrange(batch.x, b d -> d b) @ batch.x
    fn gram_einsum(batch: [b] Ex) -> [D D] = einsum(batch.x, batch.x, b d, b e -> d e)
    fn column_sums(batch: [b] Ex) -> [D] = reduce(batch.x, b d -> d, sum)
    fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(batch.x @ m.w, batch.y, over=C)
    fn scores(m: Lin, x: [n D]) -> [n C] = x @ m.w
    fn ranked(m: Lin, x: [k D]) -> [k C] = scores(m, x)
    fn mean_score(m: Lin, batch: [b] Ex) -> [] = mean(ranked(m, batch.x))
    fn weight_total(m: Lin) -> [] = sum(m.w)
    """)

# One function each that works across the batch axis with no lowering for several devices (E1801).
MAX_OVER_BATCH = LIN_HEADER + "\nfn f(batch: [b] Ex) -> [D] = max(batch.x, over=b)\n"
SOFTMAX_OVER_BATCH = LIN_HEADER + "\nfn f(batch: [b] Ex) -> [b D] = softmax(batch.x, over=b)\n"
REDUCE_MAX_OVER_BATCH = LIN_HEADER + "\nfn f(batch: [b] Ex) -> [D] = reduce(batch.x, b d -> d, max)\n"

# The batch axis not kept an axis of its own (E1802).
BATCH_GROUPED = LIN_HEADER + "\nfn f(batch: [b] Ex) -> [(b D)] = rearrange(batch.x, b d -> (b d))\n"
BATCH_TWICE = LIN_HEADER + "\nfn f(batch: [b] Ex) -> [b b] = einsum(batch.x, batch.x, b d, c d -> b c)\n"
FIXED_BATCH = LIN_HEADER + "\nfn f(batch: [8] Ex) -> [8 D] = batch.x\n"
BATCH_SIZE_AS_NUMBER = LIN_HEADER + "\nfn f(batch: [b] Ex) -> [] = sum(batch.x) / b\n"
# the batch axis in a callee's dim, as part of 2*b
BATCH_IN_ARITHMETIC = LIN_HEADER + textwrap.dedent("""\

    fn g(x: [n D]) -> [n D] = x
    fn f(batch: [b] Ex) -> [2*b D] = g(repeat(batch.x, b d -> (r b) d, r=2))
    """)

# `g` given the batch in one call and a whole value in another (E1804).
SPLIT_AND_WHOLE = LIN_HEADER + textwrap.dedent("""\

    fn g(x: [n D]) -> [n] = sum(x, over=D)
    fn f(batch: [b] Ex, w: [C D]) -> [b] = g(batch.x) + sum(g(w), over=C)
    """)

# A Python function given a batch's field, or the batch, in the controller's loop (E1901).
PYTHON_GETS_FIELD = LIN_HEADER + textwrap.dedent("""\

    python fn show(x: [b D]) = "helper_mod.show"
    fn f(data: Dataset[Ex]):
        for batch in data |> batches(4):
            show(batch.x)
    """)
PYTHON_GETS_BATCH = LIN_HEADER + textwrap.dedent("""\

    python fn show(x: [b] Ex) = "helper_mod.show"
    fn f(data: Dataset[Ex]):
        for batch in data |> batches(4):
            show(batch)
    """)

# Sums and means of fields of several dtypes over the batch: what an all-reduce sends is the result's dtype.
MIXED_DTYPES = textwrap.dedent("""\
    dim D = 4

    data Pair:
        x: [D] f64
        n: [D] i32
        h: [D] f16

    fn f64_total(batch: [b] Pair) -> [D] f64 = sum(batch.x, over=b)
    fn i32_total(batch: [b] Pair) -> [D] i64 = sum(batch.n, over=b)
    fn f16_mean(batch: [b] Pair) -> [] f16 = mean(batch.h)
    """)

# A field padded per batch (n): what a sum over the batch sends depends on n.
PADDED = textwrap.dedent("""\
    dim D = 4

    data Seq:
        x: [n D]

    fn total(batch: [b] Seq) -> [n D] = sum(batch.x, over=b)
    """)


# Gradient arithmetic: two micro-batches' gradients accumulated, clipped and applied, a field read
# (tests/several/test_accumulation.py, tests/passes/test_accumulate_pass.py).
ACCUMULATE = LIN_HEADER.replace("    param w: [D C] = normal(std=0.1)\n",
                                "    param w: [D C] = normal(std=0.1)\n    param b: [C] = normal(std=0.1)\n") + """
fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(batch.x @ m.w + m.b, batch.y, over=C)

fn accumulate(mut m: Lin, mut opt: Sgd[Lin], one: [b] Ex, two: [b] Ex, s: []) -> [C]:
    l1, g1 = value_and_grad(loss, m, one)
    l2, g2 = value_and_grad(loss, m, two)
    g = (g1 + g2) / 2
    update(mut m, mut opt, clip_norm(g - g1 * 0.0 + s * g2 - g2 * s, 0.5))
    return g.b

fn grads_of(m: Lin, one: [b] Ex) -> Grad[Lin]:
    l, g = value_and_grad(loss, m, one)
    return g

fn average(mut avg: Lin, m: Lin, decay: []):
    ema(mut avg, m, decay)
"""


def bigram_tokens(v: int, t: int, batch: int) -> str:
    """A bigram-ish model over windows of `t` tokens of a vocabulary of `v`, with its loop over a
    dataset of them in batches of `batch` (the file datasets' tests)."""
    return textwrap.dedent(f"""\
        dim V = {v}
        dim T = {t}
        dim D = 8

        data Text:
            tokens: [T] Index[V]
            targets: [T] Index[V]

        model Bigram:
            param wte: [V D] = normal(std=0.1)
            param head: [D V] = normal(std=0.1)

        fn loss(m: Bigram, batch: [b] Text) -> [] = cross_entropy(embedding(m.wte, batch.tokens) @ m.head, batch.targets, over=V)

        fn step(mut m: Bigram, mut opt: AdamW[Bigram], batch: [b] Text) -> []:
            l, g = value_and_grad(loss, m, batch)
            update(mut m, mut opt, g)
            return l

        fn fit(mut m: Bigram, mut opt: AdamW[Bigram], data: Dataset[Text], log: Sink):
            for batch in data |> shuffle(seed=0) |> batches({batch}):
                write(log, logs(loss=step(mut m, mut opt, batch)))
        """)


# The README's MLP, small, with its loop over a dataset in the program, writing each step's loss (the
# sinks' tests): batches of SINK_BATCH, SINK_STEPS of them in `sink_digits`.
SINK_BATCH, SINK_STEPS = 8, 4
SINK_MLP = textwrap.dedent(f"""\
    dim D = 12
    dim Hd = 16
    dim C = 5

    data Digit:
        img: [D]
        label: [] Index[C]

    model Mlp:
        param w1: [D Hd] = normal(std=0.2)
        param w2: [Hd C] = normal(std=0.2)

    fn forward(m: Mlp, x: [b D]) -> [b C]:
        return relu(x @ m.w1) @ m.w2

    fn loss(m: Mlp, batch: [b] Digit) -> []:
        return cross_entropy(forward(m, batch.img), batch.label, over=C)

    fn train_step(mut m: Mlp, mut opt: AdamW[Mlp], batch: [b] Digit) -> []:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l

    fn fit(mut m: Mlp, mut opt: AdamW[Mlp], data: Dataset[Digit], log: Sink):
        for batch in data |> batches({SINK_BATCH}):
            l = train_step(mut m, mut opt, batch)
            write(log, logs(loss=l))
    """)


def sink_digits(steps: int = SINK_STEPS) -> Any:
    """SINK_MLP's dataset: the first `steps` batches of the same random data."""
    import torch

    import shapescript as ss
    g = torch.Generator().manual_seed(0)
    rows = SINK_STEPS * SINK_BATCH
    img, label = torch.randn(rows, 12, generator=g), torch.randint(0, 5, (rows,), generator=g)
    return ss.TensorDataset(img=img[:steps * SINK_BATCH], label=label[:steps * SINK_BATCH])

