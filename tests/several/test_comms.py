"""The DeviceTable says beforehand what a step sends between the devices; these tests run the step
on cpu[0 1] with the runtime's collectives recorded and compare: each collective's line, count of
values and dtype, and so the bytes. And the README's figures, as the manual gives them."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
from programs import BATCH_NORM, GPT, GPT_DIMS, README
from test_equivalence import digits

import shapescript as ss
from shapescript.api import compile_program
from shapescript.plan.comms import DTYPE_BYTES, device_table
from shapescript.plan.comms_text import hover_text, report

TORCH_NAMES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int64": "i64",
               "int32": "i32", "bool": "bool"}


def expected(prog, fn: str, sizes: dict[str, int] | None = None) -> Counter:
    """What the table says one call of `fn` sends: (line, column, values, dtype, operation), each as
    often as it runs; `sizes` gives the generic dims' (the batch's own) by name."""
    plan = prog.device_table.fns[fn]
    return Counter((s.collective.span.line, s.collective.span.col, sized(s.collective.count, sizes),
                    s.collective.dtype, s.collective.op) for s in plan.sent for _ in range(s.times))


def sized(expr, sizes: dict[str, int] | None) -> int:
    """A count of the table, with the generic dims' sizes put in."""
    return int(expr.subs({s: (sizes or {})[s.name] for s in expr.free_symbols}))


def recorded(prog, *args) -> tuple[Counter, int]:
    pool = prog.workers()
    pool.call("record_collectives", (True,))
    prog.train_step(*args)
    runs = pool.call("record_collectives", (False,))
    assert all(run == runs[0] for run in runs)  # every worker ran the same collectives
    out = Counter()
    nbytes = 0
    for where, values, dtype, op in runs[0]:
        line, col = map(int, re.fullmatch(r".*:(\d+):(\d+)", where).groups())
        out[(line, col, values, TORCH_NAMES[dtype], op)] += 1
        nbytes += values * DTYPE_BYTES[TORCH_NAMES[dtype]]
    return out, nbytes


CASES = {
    "mlp": (README, None, "Mlp", lambda: (digits(1, 64, 784, 10)[0],)),
    "attention": (GPT, GPT_DIMS, "Gpt", lambda: ({"tokens": torch.randint(0, 11, (7, 8)),
                                                  "targets": torch.randint(0, 11, (7, 8))}, ss.Eval)),
    "batch_norm": (BATCH_NORM, None, "Net", lambda: ({"x": torch.randn(10, 6), "y": torch.randint(0, 3, (10,))},
                                                     ss.Train(seed=0))),
}


def sharded(source: str) -> str:
    """The program with `shard params` under its devices line (one on `cpu` if it has none: the
    devices it is loaded on replace it, the option stays)."""
    line = next((text for text in source.splitlines() if text.startswith("devices ")), None)
    if line is None:
        return "devices cpu\n    shard params\n" + source
    return source.replace(line, f"{line}\n    shard params", 1)


SHARDED = [("mlp", "cpu[0 1]"), ("mlp", "cpu[0 1 2]"), ("attention", "cpu[0 1 2]")]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_table_says_what_a_step_sends(case: str) -> None:
    _compare_a_step(*CASES[case], "cpu[0 1]")


@pytest.mark.slow
@pytest.mark.parametrize("case,devices", SHARDED)
def test_the_table_says_what_a_sharded_step_sends(case: str, devices: str) -> None:
    """With `shard params`: each read's all-gather, gathered again in the backward pass, its
    gradient's reduce-scatter, clip_norm's one number; no all-reduce of the gradients."""
    source, dims, model, args = CASES[case]
    ops = _compare_a_step(sharded(source), dims, model, args, devices)
    assert ops["all-gather"] == 2 * ops["reduce-scatter"] > 0
    assert ops["all-reduce"] == (3 if case == "attention" else 2)  # the loss's sum and count, forward and backward; clip_norm's


def _compare_a_step(source: str, dims, model: str, args, devices: str, sizes: dict[str, int] | None = None) -> Counter:
    prog = ss.load(source, devices=devices, dims=dims, name="prog.ss")
    try:
        m = getattr(prog, model).init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        got, nbytes = recorded(prog, m, opt, *args())
        want = expected(prog, "train_step", sizes)
        assert got == want
        assert nbytes == sized(prog.device_table.fns["train_step"].bytes, sizes)
        assert len(want) >= 2  # the gradients and the loss at least
        return Counter(op for (*_, op), times in got.items() for _ in range(times))
    finally:
        prog.stop()


def test_the_readme_figures_on_three_gpus() -> None:
    checked = compile_program(README, "mlp.ss", "cuda[0 1 2]")
    table = device_table(checked)
    assert table.shares() == [22, 21, 21] and table.batch == 64
    assert int(table.models["Mlp"].bytes) == 813_056
    line = next(i for i, text in enumerate(README.splitlines(), 1) if "value_and_grad" in text)
    text = hover_text(checked, line, 5)
    assert "203,264 × f32 = 813,056 bytes (794 KiB)" in text
    assert "inside `loss` (forward and backward): 16 bytes per call" in text
    assert "In all: 813,072 bytes (794 KiB)." in text
    assert int(table.fns["train_step"].bytes) == 813_072
    m_value = table.value_at(*_position(README, "fn train_step(mut m", "m"))
    assert m_value.kind == "model" and int(m_value.bytes) == 813_056
    batch = table.value_at(*_position(README, "fn loss(", "batch"))
    assert batch.kind == "split" and batch.axis == "b" and int(batch.per_example) == 784 * 4 + 8
    assert "22/21/21 for a batch of 64" in report(checked)


def test_one_device_sends_nothing() -> None:
    table = device_table(compile_program(README, "mlp.ss", "cpu"))
    assert table.lines == {} and all(not f.sent for f in table.fns.values())


def test_sizes_stay_symbolic_where_the_types_dont_fix_them() -> None:
    src = ("dim D = 768\ndata Seq:\n    x: [n D]\n"  # n: each batch pads to its longest item
           "fn total(batch: [b] Seq) -> []:\n    s = sum(batch.x, over=b)\n    return mean(s)\n")
    table = device_table(compile_program(src, "s.ss", "cpu[0 1]"))
    (item,) = [i for items in table.lines.values() for i in items]
    from shapescript.plan.sizes_text import bytes_text
    assert bytes_text(item.bytes) == "3,072·n bytes"


def _position(source: str, line_start: str, word: str) -> tuple[int, int]:
    for number, text in enumerate(source.splitlines(), 1):
        if text.lstrip().startswith(line_start):
            return number, text.index(word, text.index(line_start[:-1]) + 3) + 1
    raise AssertionError(line_start)


def test_the_optimizer_state_is_what_adamw_keeps() -> None:
    prog = ss.load(README, devices="cpu", name="mlp.ss")
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    prog.train_step(m, opt, digits(1, 8, 784, 10)[0])
    kept = sum(t.numel() * t.element_size() for state in opt.torch_opt.state.values()
               for key, t in state.items() if key in ("exp_avg", "exp_avg_sq"))
    table = device_table(compile_program(README, "mlp.ss", "cpu[0 1]"))
    opt_value = table.value_at(*_position(README, "fn train_step(mut m", "opt"))
    assert opt_value.kind == "optimizer" and int(opt_value.bytes) == kept == 2 * 203_264 * 4
