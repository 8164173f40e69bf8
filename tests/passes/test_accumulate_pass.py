"""Gradient arithmetic's typing and the accumulation pass (plan/accumulate.py): which value_and_grad
calls keep their gradients each device's own, and where the DeviceTable puts their all-reduce."""

from __future__ import annotations

import pytest
from facts import build, diagnostics, line_of
from programs import ACCUMULATE as PROGRAM

from shapescript.ir import nodes as N
from shapescript.ir.walk import walk
from shapescript.plan.comms import device_table


def test_the_table_shows_one_gradient_all_reduce_where_the_update_reads_them() -> None:
    """Deferred: nothing at the two value_and_grad lines, one all-reduce at the update (of the
    worked-out value) and one where `g.b` reads `g` whole. A function that returns its gradients
    keeps value_and_grad's own all-reduce."""
    checked = build(PROGRAM, "cpu[0 1]")
    table = device_table(checked)
    gradients = {line: [s for item in items for s in item.sent if not s.via and "gradients of `Lin`" in s.collective.what]
                 for line, items in table.lines.items()}
    at = {text: line_of(PROGRAM, text) for text in ("l1, g1 =", "l2, g2 =", "update(", "return g.b", "l, g =")}
    assert [len(gradients.get(at[t], [])) for t in at] == [0, 0, 1, 1, 1]
    deferred = {fn.name: [e.deferred for e in walk(fn.body) if isinstance(e, N.GradCall)]
                for fn in checked.module.functions}
    assert deferred["accumulate"] == [True, True] and deferred["grads_of"] == [False]
    one = build(PROGRAM, "cpu")  # one device: nothing to defer
    assert not any(e.deferred for f in one.module.functions for e in walk(f.body) if isinstance(e, N.GradCall))


@pytest.mark.parametrize(("change", "message"), [
    ("g = (g1 * g2) / 2", "`*` of two gradients"),
    ("g = (g1 + l2) / 2", "`+` of a gradient and []"),
    ("g = (g1 + g2) / one.x", "`/` of a gradient and [b D]"),
    ("g = 2 / (g1 + g2)", "`/` of a gradient and int"),
])
def test_arithmetic_a_gradient_doesnt_have_is_refused(change: str, message: str) -> None:
    [d] = diagnostics(PROGRAM.replace("g = (g1 + g2) / 2", change), "cpu")
    assert d.code == "E0408" and message in d.message, d


def test_a_gradients_field_is_its_params_type_and_a_buffer_has_none() -> None:
    source = PROGRAM.replace("    param b: [C] = normal(std=0.1)\n",
                             "    param b: [C] = normal(std=0.1)\n    buffer seen: [C] = zeros()\n")
    [d] = diagnostics(source.replace("return g.b", "return g.seen"), "cpu")
    assert d.code == "E0203" and "it is a buffer" in d.message
    [d] = diagnostics(PROGRAM.replace("-> [C]:", "-> [D]:", 1), "cpu")
    assert d.code == "E0305", d


def test_ema_takes_two_models_of_one_type_and_a_number() -> None:
    other = PROGRAM + "\nmodel Other:\n    param v: [D] = zeros()\n\nfn bad(mut o: Other, m: Lin):\n    ema(mut o, m, 0.9)\n"
    [d] = diagnostics(other, "cpu")
    assert d.code == "E0401" and d.message == "`ema` moves a Lin toward a model of its own type, not Other"
    [d] = diagnostics(PROGRAM.replace("ema(mut avg, m, decay)", "ema(mut avg, m, m)"), "cpu")
    assert d.code == "E0401" and "decay is a number or a float []" in d.message
    [d] = diagnostics(PROGRAM.replace("ema(mut avg, m, decay)", "ema(avg, m, decay)"), "cpu")
    assert d.code == "E0502"


def test_a_clipped_value_is_read_whole_already() -> None:
    """`g = clip_norm(g1 + g2, 1.0)` averages there: the update of `g` after it sends nothing more."""
    source = PROGRAM.replace("    g = (g1 + g2) / 2\n    update(mut m, mut opt, clip_norm(g - g1 * 0.0 + s * g2 - g2 * s, 0.5))\n",
                             "    g = clip_norm(g1 + g2, 1.0)\n    update(mut m, mut opt, g)\n")
    assert "clip_norm(g1 + g2, 1.0)" in source
    table = device_table(build(source, "cpu[0 1]"))
    sends = {line: [s for item in items for s in item.sent if not s.via and "gradients of `Lin`" in s.collective.what]
             for line, items in table.lines.items()}
    assert [len(sends.get(line_of(source, t), [])) for t in ("g = clip_norm", "update(", "return g.b")] == [1, 0, 0]
