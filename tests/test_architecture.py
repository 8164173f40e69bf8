"""docs/architecture.md's "Adding an op", followed: its ```python block declares `softplus` in
the op table, and nothing else is needed for the op to be checked, lowered, run and placed on
several devices."""

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
from shapescript.ops import OPS, Op
from shapescript.pipeline import check_source
from shapescript.plan.comms import device_table

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.fixture()
def softplus() -> Iterator[Op]:
    """The doc's block, run as written; the op is taken out of the table again afterwards."""
    blocks = PYTHON_BLOCK.findall((ROOT / "docs" / "architecture.md").read_text())
    assert len(blocks) == 1 and "softplus" not in OPS
    exec(compile(blocks[0], "docs/architecture.md python block 0", "exec"), {"__name__": "architecture"})
    try:
        yield OPS["softplus"]
    finally:
        OPS.pop("softplus", None)
        RULES.pop("softplus", None)


def test_the_declared_op_is_checked_lowered_and_run_like_torch(softplus: Op) -> None:
    prog = ss.load("fn f(x: [n]) -> [n] = softplus(x)\n", name="sp.ss")
    x = torch.randn(7, generator=torch.Generator().manual_seed(0))
    assert torch.equal(prog.f(x), F.softplus(x))
    assert "_F.softplus(x)" in prog.python_source
    with pytest.raises(ss.CompileError) as info:  # the rule's `floats=True`
        ss.load("fn f(x: [n] i64) -> [n] i64 = softplus(x)\n", name="sp.ss")
    assert info.value.codes == ["E0308"]


def test_on_two_devices_it_works_on_each_example_and_sends_nothing(softplus: Op) -> None:
    source = "dim D = 4\n\ndata Ex:\n    x: [D]\n\nfn f(batch: [b] Ex) -> [] = sum(softplus(batch.x))\n"
    table = device_table(check_source(source, "sp.ss", DeviceSet("cpu", (0, 1))))
    sent = [item.collective.what for items in table.lines.values() for item in items if item.collective]
    assert sent == ["`sum`'s partial sums, every device's part of the batch added up"]  # the sum's, none of its own


def test_without_the_declaration_the_name_is_unknown() -> None:
    with pytest.raises(ss.CompileError) as info:
        ss.load("fn f(x: [n]) -> [n] = softplus(x)\n", name="sp.ss")
    assert info.value.codes == ["E0201"]
