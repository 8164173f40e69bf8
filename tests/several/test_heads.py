"""`split H`: each device holds H / N of every value with an axis of size H, and the program
computes what it computes on one device. Checked against one device (`cpu`), the DeviceTable against
the collectives the workers run, and checkpoints between every layout."""

from __future__ import annotations

import textwrap

import pytest
import torch
from checkpoints import check_checkpoints_move
from programs import GPT
from test_comms import _compare_a_step
from test_equivalence import compare, run

import shapescript as ss

pytestmark = pytest.mark.slow

HEADS_DIMS = {"V": 11, "T": 8, "D": 16, "H": 12, "Dh": 2, "F": 32, "L": 2}  # 12 heads: 4 or 6 a device


def with_options(source: str, *options: str) -> str:
    """The program under a devices line with `options` (the devices it is loaded on replace the line's)."""
    return "devices cpu\n" + "".join(f"    {o}\n" for o in options) + source


def text_batches(n: int, seed: int = 1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"tokens": torch.randint(0, 11, (7, 8), generator=g), "targets": torch.randint(0, 11, (7, 8), generator=g)}
            for _ in range(n)]


@pytest.mark.parametrize("devices,options", [("cpu[0 1 2]", ("split H",)), ("cpu[0 1]", ("split H",)),
                                             ("cpu[0 1 2]", ("split H", "shard params"))])
def test_the_attention_example_split_along_h_equals_one_device(devices: str, options: tuple[str, ...]) -> None:
    """20 AdamW steps of the attention example, dropout in Eval: 4 heads a device on 3, 6 on 2; with
    both options the params without H (w_qkv, the MLPs, the embeddings) are in pieces too."""
    batches = text_batches(20)
    reference = run(GPT, "cpu", "Gpt", batches, (ss.Eval,), HEADS_DIMS)
    compare(reference, run(with_options(GPT, *options), devices, "Gpt", batches, (ss.Eval,), HEADS_DIMS))


def test_dropout_in_train_draws_one_devices_masks() -> None:
    """With split H every device draws the whole mask of a value (each the same, as one device
    draws it) and keeps its heads' part: in Train too, results are one device's."""
    batches = text_batches(5)
    reference = run(GPT, "cpu", "Gpt", batches, (ss.Train(seed=3),), HEADS_DIMS)
    compare(reference, run(with_options(GPT, "split H"), "cpu[0 1 2]", "Gpt", batches, (ss.Train(seed=3),),
                           HEADS_DIMS))


@pytest.mark.parametrize("options", [("split H",), ("split H", "shard params")])
def test_the_table_says_what_a_step_split_along_h_sends(options: tuple[str, ...]) -> None:
    """Every collective of a step, its line, values, dtype and operation, as the DeviceTable says:
    the partial sums of the last matmul (w_o's rows), the whole params' gradients, clip_norm's."""
    args = lambda: (text_batches(1)[0], ss.Eval)  # noqa: E731
    ops = _compare_a_step(with_options(GPT, *options), HEADS_DIMS, "Gpt", args, "cpu[0 1 2]", {"b": 7, "n": 8})
    assert ops["all-reduce"] >= 2 * 2 + 1  # each block's partial sums, forward and backward; clip_norm's


# Every rule of the plan in one small program: values computed whole and cut (the split of x @ m.q,
# whose param is whole: H comes after 2 in its group), a param split along H (x @ m.w), a generic
# dim bound to H (k, read as a number), an op along H that needs the whole (softmax: gathered and
# cut again; logsumexp: gathered), a contraction over H (partial sums), a whole value beside them.
RULES = textwrap.dedent("""\
    dim D = 5
    dim H = 6
    dim C = 3

    data Ex:
        x: [D]
        y: [] Index[C]

    model Net:
        param w: [D H] = normal(std=0.5)
        param v: [H C] = normal(std=0.5)
        param u: [H] = normal(std=0.5)
        param q: [D (2 H)] = normal(std=0.5)

    fn scale(s: [b k], g: [k]) -> [b k] = s * g / k

    fn scores(m: Net, x: [b D]) -> [b H] = scale(x @ m.w, m.u)

    fn loss(m: Net, batch: [b] Ex) -> []:
        a, c = split(batch.x @ m.q, b (2 H) -> b H)
        s = scores(m, batch.x) + a * c
        p = softmax(s, over=H)
        t = logsumexp(s, over=H)
        h = p @ m.v
        return cross_entropy(h, batch.y, over=C) + mean(t) * 0.1

    fn step(mut m: Net, mut opt: AdamW[Net], batch: [b] Ex) -> []:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, clip_norm(g, 0.5))
        return l
    """)


def test_each_rule_of_the_plan_computes_what_one_device_computes() -> None:
    g = torch.Generator().manual_seed(5)
    batches = [{"x": torch.randn(9, 5, generator=g), "y": torch.randint(0, 3, (9,), generator=g)} for _ in range(8)]
    s, u = torch.randn(4, 6, generator=g), torch.randn(6, generator=g)
    results = []
    for source, devices in ((RULES, "cpu"), (with_options(RULES, "split H"), "cpu[0 1 2]")):
        prog = ss.load(source, devices=devices, name="rules.ss")
        try:
            m = prog.Net.init(seed=0)
            opt = ss.adamw(m, lr=1e-2)
            losses = [float(prog.step(m, opt, b)) for b in batches]
            # From Python: arguments with H cut for each device, results with H joined again.
            results.append((losses, m.state_dict(), prog.scores(m, batches[0]["x"]), prog.scale(s, u)))
        finally:
            prog.stop()
    (losses, state, scores, scaled), (losses_3, state_3, scores_3, scaled_3) = results
    assert losses_3 == pytest.approx(losses, abs=1e-5)
    for key in state:
        torch.testing.assert_close(state_3[key], state[key], atol=1e-5, rtol=0, msg=key)
    torch.testing.assert_close(scores_3, scores, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(scaled_3, s * u / 6)
    torch.testing.assert_close(scaled, s * u / 6)


def test_the_plan_gathers_cuts_and_sums_where_the_rules_say() -> None:
    prog = ss.load(with_options(RULES, "split H"), devices="cpu[0 1 2]", name="rules.ss")
    checked, source = prog.checked, prog.worker_source
    assert "_rt.cut_heads(_rt.matmul(batch.x, m._m_q).unflatten(1, (2, 6)).permute(1, 0, 2).unbind(0), (1, 1), " in source
    assert "scale(_rt.matmul(x, m._m_w), m._m_u)" in source  # each device's part of w, of its columns' values
    assert "_rt.gather_heads(s, 1, " in source  # softmax and logsumexp along H take it whole
    assert "_rt.all_sum(_rt.matmul(p, m._m_v), " in source  # a contraction over H: partial sums
    assert "_size_s_1 = s.shape[1] * _rt.world()" in source  # k read as a number: the whole of it
    assert dict(checked.module.head_params) == {("Net", "w"): 1, ("Net", "v"): 0, ("Net", "u"): 0}  # not q


def test_an_argument_that_does_not_split_evenly_is_refused() -> None:
    prog = ss.load(with_options(RULES, "split H"), devices="cpu[0 1 2]", name="rules.ss")
    try:
        with pytest.raises(ss.ShapeError, match=r"`scale`.*argument 1 .* 3 devices .* 5 entries"):
            prog.scale(torch.randn(4, 5), torch.randn(5))
    finally:
        prog.stop()


LAYOUTS = {"one device": ((), "cpu"), "data parallel": ((), "cpu[0 1]"), "sharded": (("shard params",), "cpu[0 1 2]"),
           "split H": (("split H",), "cpu[0 1 2]"), "both": (("split H", "shard params"), "cpu[0 1]")}


@pytest.fixture(scope="module")
def programs():
    progs = {name: ss.load(with_options(GPT, *options), devices=devices, dims=HEADS_DIMS, name="gpt.ss")
             for name, (options, devices) in LAYOUTS.items()}
    yield progs
    for prog in progs.values():
        prog.stop()


def test_checkpoints_move_between_every_layout(programs, tmp_path) -> None:
    """Saved in each layout after two steps, loaded in every other one, saved again: the same file,
    every param and every value of the optimizer's state bit for bit; from Python, whole tensors."""
    batches = text_batches(2, seed=3)

    def train(prog, m, opt) -> None:
        for b in batches:
            prog.train_step(m, opt, b, ss.Eval)
    check_checkpoints_move(programs, "Gpt", train, tmp_path)


def test_the_programs_own_loop_takes_whole_batches() -> None:
    """The attention example's `train`: with split H every worker loads every batch whole."""
    g = torch.Generator().manual_seed(0)
    data = ss.TensorDataset(tokens=torch.randint(0, 11, (70, 8), generator=g),
                            targets=torch.randint(0, 11, (70, 8), generator=g))
    runs = []
    for source, devices in ((GPT, "cpu"), (with_options(GPT, "split H"), "cpu[0 1 2]")):
        prog = ss.load(source, devices=devices, dims=HEADS_DIMS, name="gpt.ss")
        try:
            m = prog.Gpt.init(seed=0)
            log = ss.sinks.memory()
            prog.train(m, ss.adamw(m, lr=1e-3), data, ss.Eval, log)
            runs.append([record["loss"] for record in log.records])
        finally:
            prog.stop()
    assert len(runs[0]) == 3 and runs[1] == pytest.approx(runs[0], abs=1e-5)  # batches of 32 from 70
