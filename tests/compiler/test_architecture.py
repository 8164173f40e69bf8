"""docs/architecture.md's "Adding an op" and "Adding a pass", followed. The first's ```python block
declares `mish` in the op table, and nothing else is needed for the op to be checked, lowered,
run and placed on several devices. The second's adds a rewrite of the IR to the optimizations,
and nothing else is needed for every build but the debug one to run it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from support import ROOT

import shapescript as ss
from shapescript.check.calls import RULES
from shapescript.devices import DeviceSet
from shapescript.ir.passes import OPTIMIZATIONS
from shapescript.ops import OPS, Op
from shapescript.pipeline import check_source
from shapescript.plan.comms import device_table

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def run_block(section: str) -> None:
    """The ```python block of docs/architecture.md's section `section`, run as written."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    blocks = PYTHON_BLOCK.findall(text[start:end if end >= 0 else None])
    assert len(blocks) == 1, f"{section}: {len(blocks)} python blocks"
    exec(compile(blocks[0], f"docs/architecture.md, {section}", "exec"), {"__name__": "architecture"})


@pytest.fixture()
def mish() -> Iterator[Op]:
    """The doc's block, run as written; the op is taken out of the table again afterwards."""
    assert "mish" not in OPS
    run_block("Adding an op")
    try:
        yield OPS["mish"]
    finally:
        OPS.pop("mish", None)
        RULES.pop("mish", None)


def test_the_declared_op_is_checked_lowered_and_run_like_torch(mish: Op) -> None:
    prog = ss.load("fn f(x: [n]) -> [n] = mish(x)\n", name="mish.ss")
    x = torch.randn(7, generator=torch.Generator().manual_seed(0))
    assert torch.equal(prog.f(x), F.mish(x))
    assert "_F.mish(x)" in prog.python_source
    with pytest.raises(ss.CompileError) as info:  # the rule's `floats=True`
        ss.load("fn f(x: [n] i64) -> [n] i64 = mish(x)\n", name="mish.ss")
    assert info.value.codes == ["E0308"]


def test_on_two_devices_it_works_on_each_example_and_sends_nothing(mish: Op) -> None:
    source = "dim D = 4\n\ndata Ex:\n    x: [D]\n\nfn f(batch: [b] Ex) -> [] = sum(mish(batch.x))\n"
    table = device_table(check_source(source, "mish.ss", DeviceSet("cpu", (0, 1))))
    sent = [item.collective.what for items in table.lines.values() for item in items if item.collective]
    assert sent == ["`sum`'s partial sums, every device's part of the batch added up"]  # the sum's, none of its own


def test_without_the_declaration_the_name_is_unknown() -> None:
    with pytest.raises(ss.CompileError) as info:
        ss.load("fn f(x: [n]) -> [n] = mish(x)\n", name="mish.ss")
    assert info.value.codes == ["E0201"]


@pytest.fixture()
def times_one() -> Iterator[None]:
    """The doc's pass, added as written; taken out of the optimizations again afterwards."""
    before = list(OPTIMIZATIONS)
    run_block("Adding a pass")
    assert len(OPTIMIZATIONS) == len(before) + 1
    try:
        yield
    finally:
        OPTIMIZATIONS[:] = before


TIMES_ONE = """\
fn f(x: [n]) -> [n] = relu(x) * 1
fn g(x: [n] i32) -> [n] = x * 1.0
fn h(batch: [b] Ex) -> [] = sum(batch.x * 1)
"""
EX = "dim D = 3\ndata Ex:\n    x: [D]\n"


def test_the_added_pass_runs_in_every_build_but_the_debug_one(times_one: None) -> None:
    prog = ss.load(EX + TIMES_ONE, name="one.ss")
    debug = ss.load(EX + TIMES_ONE, name="one.ss", check_types=True)
    assert "return torch.relu(x)  # one.ss:4:" in prog.python_source  # x * 1 of the same type: x
    assert "relu(x) * 1" in debug.python_source  # the debug build keeps what the program says
    assert "x * 1.0" in prog.python_source  # i32 * 1.0 is f32: a new type, kept
    x = torch.randn(9, dtype=torch.float32, generator=torch.Generator().manual_seed(1))
    assert torch.equal(prog.f(x), debug.f(x))
    ints = torch.arange(4, dtype=torch.int32)
    assert torch.equal(prog.g(ints), debug.g(ints)) and prog.g(ints).dtype == torch.float32


def test_the_added_pass_keeps_every_layout_equal(times_one: None) -> None:
    batch = {"x": torch.randn(6, 3, generator=torch.Generator().manual_seed(2))}
    want = batch["x"].sum()
    for devices in ("cpu", "cpu[0 1]", "cpu[0 1 2]"):
        prog = ss.load(EX + TIMES_ONE, devices=devices, name="one.ss")
        try:
            source = prog.worker_source if devices != "cpu" else prog.python_source
            assert "batch.x * 1" not in source, devices  # folded where the batch is split too
            torch.testing.assert_close(prog.h(batch), want, atol=1e-5, rtol=0)
        finally:
            prog.stop()


def test_without_the_pass_the_product_stays() -> None:
    assert "relu(x) * 1" in ss.load(EX + TIMES_ONE, name="one.ss").python_source
