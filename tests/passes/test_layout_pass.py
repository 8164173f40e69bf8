"""The layout options' pass (plan/layout.py) over the IR: with `shard params` every read of a param on
the workers is gathered from the devices' pieces; with `split H` the params with H are split and
each value the split can't keep is gathered, cut or summed (a Heads node around it). The passes of
plan/ are functions of the IR alone: run one by one on the elaborated module, they give the module
the compiler plans."""

from __future__ import annotations

import textwrap

import programs as P
from facts import FILE, build, line_of

from shapescript.check.checker import check_program
from shapescript.ir import nodes as N
from shapescript.ir.walk import walk
from shapescript.pipeline import parse_devices
from shapescript.plan.layout import lay_out, split_heads
from shapescript.plan.passes import plan_program
from shapescript.plan.placement import place
from shapescript.plan.planning import Planning
from shapescript.plan.split import split_batches
from shapescript.shapes.plans import HeadsKind
from shapescript.syntax.parser import parse

HEADS = P.HEADS_HEADER + P.HEADS_NET + textwrap.dedent("""\

    fn loss(m: Net, batch: [b] Ex) -> [] = cross_entropy(scores(m, batch.x), batch.y, over=C)
    """)


def heads_of(module: N.Module, fn: str) -> list[tuple[HeadsKind, tuple[int | None, ...], str]]:
    """Each Heads node of `fn`, outermost first, with the type of the value it wraps."""
    return [(e.kind, e.axes, e.value.ty.show()) for e in walk(module.function(fn).body) if isinstance(e, N.Heads)]


def members(module: N.Module, fn: str) -> list[tuple[str, bool]]:
    return [(e.name, e.gathered) for e in walk(module.function(fn).body) if isinstance(e, N.Member)]


def test_split_heads_gathers_for_softmax_along_H_and_sums_the_last_contraction() -> None:
    module = build(HEADS, "cpu[0 1]").module
    assert module.heads == "H" and dict(module.head_params) == {("Net", "w"): 1, ("Net", "v"): 0}
    # x @ m.w is split along H (m.w's axis 1): softmax needs it whole, then its result is cut again;
    # softmax(...) @ m.v contracts H, so every device's partial result is summed.
    assert heads_of(module, "scores") == [
        (HeadsKind.SUM, (), "[b C]"), (HeadsKind.CUT, (1,), "[b H]"), (HeadsKind.GATHER, (1,), "[b H]")]
    assert not heads_of(module, "loss")  # takes the summed result whole
    assert members(module, "scores") == [("w", False), ("v", False)]  # held in parts, never gathered


def test_on_one_device_nothing_is_marked() -> None:
    module = build(HEADS, "cpu").module
    assert module.heads is None and not module.head_params and not heads_of(module, "scores")


def test_shard_params_gathers_every_param_read_on_the_workers_only() -> None:
    sharded = P.LINEAR.replace("dim D", "devices cpu\n    shard params\ndim D", 1)
    module = build(sharded, "cpu[0 1]").module
    assert members(module, "scores") == [("w", True)]
    assert all(not gathered for fn in ("fit",) for _, gathered in members(module, fn))
    assert module.heads is None and not any(heads_of(module, f.name) for f in module.functions)


def test_with_both_options_a_param_split_along_H_is_not_gathered() -> None:
    both = HEADS.replace("split H", "shard params\n    split H")
    module = build(both, "cpu[0 1]").module
    assert members(module, "scores") == [("w", False), ("v", False)]
    # split H's marks are those of split H alone, on the body whose other params' reads are gathered
    assert heads_of(module, "scores") == heads_of(build(HEADS, "cpu[0 1]").module, "scores")
    extra = both + "\nmodel Bias:\n    param c: [C] = zeros()\n\nfn shift(m: Bias, x: [b C]) -> [b C] = x + m.c\n"
    assert members(build(extra, "cpu[0 1]").module, "shift") == [("c", True)]


def test_the_passes_run_one_by_one_on_the_elaborated_ir_give_the_planned_module() -> None:
    for source, devices, heads in [(P.LINEAR, "cpu[0 1]", False), (P.SPLIT_OPS, "cpu[0 1 2]", False),
                                   (HEADS, "cpu[0 1]", True)]:
        device_set = parse_devices(devices)
        checked = check_program(parse(source, FILE), FILE, device_set)
        planning = Planning(checked.module)
        planning.module = place(planning)
        planning.module = split_heads(planning.module) if heads else split_batches(planning)
        assert not planning.diagnostics
        assert lay_out(planning.module) == plan_program(checked).module, source[:40]


def test_heads_mark_lines_are_where_the_devicetable_counts_them() -> None:
    """The Heads nodes carry the span of the value they wrap: the DeviceTable's line."""
    module = build(HEADS, "cpu[0 1]").module
    lines = {e.span.line for e in walk(module.function("scores").body) if isinstance(e, N.Heads)}
    assert lines == {line_of(HEADS, "fn scores(")}
