"""The op table (shapescript/ops/): each op in it is declared once, with everything the
stages need, and the stages name none of those ops themselves."""

from __future__ import annotations

import re

import pytest
from support import ROOT

from shapescript.check.builtins import BUILTIN_NAMES, RULES
from shapescript.pipeline import check_source
from shapescript.ops import OPS, Across
from shapescript.devices import DeviceSet
from shapescript.errors import CompileError

# The stages that once listed ops by name: the batch split, the DeviceTable, the code generator;
# with the strings they may hold that are spelled as an op but aren't one.
STAGES = {"shapescript/check/split.py": set(),
          "shapescript/check/comms.py": {"split"},  # a value's layout: "split" or "whole"
          "shapescript/lower/codegen.py": {"min", "max"},  # clamp's bounds, min= and max=
          # The IR's printer: value_and_grad's calls are the IR's GradCalls, lowered by its entry.
          "shapescript/lower/printer.py": {"value_and_grad"}}


# value_and_grad's all-reduce sends the gradients of every param, one all-reduce per dtype, which
# comms.py's `gradients` counts (a payload is one dtype's values).
SENDS_COUNTED_BY_COMMS = {"value_and_grad"}

# With `shard params`, a norm of gradients adds up every device's pieces' squares (one number).
SENDS_WITH_PIECES = {"norm", "clip_norm"}

# Ops whose result a device can't compute from its part of H alone, however called: their split
# operands must be gathered (no `heads` rule), as an extern fn's are.
NEVER_LOCAL_ALONG_H = {"cross_entropy", "dropout", "batch_norm", "embedding", "one_hot", "split", "repeat"}


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_has_a_rule_a_lowering_and_an_entry_for_the_batch_axis(name: str) -> None:
    op = OPS[name]
    assert op.name == name and name in BUILTIN_NAMES and RULES[name] is not None
    assert callable(op.rule) and callable(op.lower) and isinstance(op.across, Across)
    assert 0 <= op.required <= len(op.params) and len(set(op.params)) == len(op.params)
    # Only a rule that places its own arguments takes any number of them (print) or none (Eval).
    assert op.required >= 1 or op.own_args
    if op.across.over_batch is None:  # works on each example alone: nothing to combine, nothing refused
        assert op.across.kind is None and op.across.lower is None and op.across.payload is None
    elif op.across.refused:
        assert op.across.lower is None and op.across.payload is None
    elif name in SENDS_COUNTED_BY_COMMS:
        assert op.across.lower is not None and op.across.payload is None
    else:  # combined: the DeviceTable must be able to say what it sends
        assert op.across.payload is not None
    # Its layout rule: what it sends when the params are in pieces (norms of gradients only), and how
    # it works on values split along H (none: it takes them whole, which is always right).
    assert (op.layout is not None and op.layout.sharded is not None) == (name in SENDS_WITH_PIECES)
    if op.layout is not None and op.layout.heads is not None:
        assert name not in NEVER_LOCAL_ALONG_H


@pytest.mark.parametrize("stage", STAGES)
def test_no_stage_names_an_op_of_the_table(stage: str) -> None:
    text = (ROOT / stage).read_text()
    # A string of the op's name, with the same quote on either side (not `"""value_and_grad's`).
    named = {name for name in OPS if re.search(rf"([\"']){re.escape(name)}\1", text)}
    assert named <= STAGES[stage], f"{stage} names {sorted(named - STAGES[stage])}: read the op table instead"


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_is_in_the_standard_librarys_docs(name: str) -> None:
    """In the library's docs, or called in the language's section on the controller (its loops,
    logs and checkpoints)."""
    stdlib = (ROOT / "docs" / "stdlib.md").read_text()
    controller = (ROOT / "docs" / "language.md").read_text().split("## The controller", 1)[1].split("\n## ", 1)[0]
    assert re.search(rf"`[^`\n]*\b{name}\b[^`\n]*`", stdlib) or re.search(rf"\b{name}\(", controller), name


BATCH = "dim C = 4\n\ndata Ex:\n    x: [C]\n    y: [] Index[C]\n\n"


@pytest.mark.parametrize("call, sends", [
    ("sum(batch.x)", ("`sum`'s partial sums", 1)),  # one value: the sum of a device's part
    ("mean(batch.x)", ("`mean`'s sum and count", 2)),  # its sum and its count
    ("cross_entropy(batch.x, batch.y, over=C)", ("cross_entropy's sum and count", 2)),
    ("max(batch.x)", None), ("sum(softmax(batch.x, over=b))", None), ("sum(sort(batch.x, over=b))", None),
])
def test_the_tables_entry_decides_across_the_batch_axis(call: str, sends: tuple[str, int] | None) -> None:
    """On two devices an op over the batch axis is combined (the DeviceTable lists what one
    device sends, counted here by hand) or refused with E1801, as its entry says."""
    source = BATCH + f"fn f(batch: [b] Ex) -> [] = {call}\n"
    devices = DeviceSet("cpu", (0, 1))
    if sends is None:
        with pytest.raises(CompileError) as info:
            check_source(source, "t.ss", devices)
        assert info.value.codes == ["E1801"]
        return
    table = check_source(source, "t.ss", devices).devices
    sent = [item.collective for items in table.lines.values() for item in items if item.collective]
    assert len(sent) == 1 and sent[0].what.startswith(sends[0]) and int(sent[0].count) == sends[1]


@pytest.mark.parametrize("call", ["relu(mut x)", "sum(mut x, over=n)", "rearrange(mut x, n -> n)",
                                  "masked_fill(x, mut m, 0.0)"])
def test_mut_on_an_argument_of_an_op_is_refused(call: str) -> None:
    """No op of the table changes its arguments (update and load check `mut` themselves)."""
    source = f"fn f(x: [n], m: [n] bool) -> [n] = {call}\n".replace("-> [n] = sum", "-> [] = sum")
    with pytest.raises(CompileError) as info:
        check_source(source, "mut.ss")
    assert info.value.codes == ["E0503"]
    assert "doesn't change" in info.value.diagnostics[0].message
