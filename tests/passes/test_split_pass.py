"""The batch split (plan/split.py): which generic dims each function has split, where its
parameters and result have the batch axis, which operations combine across the devices, and the
diagnostics for what can't be split (E1801, E1802, E1804, E1901)."""

from __future__ import annotations

import programs as P
import pytest
from facts import FILE, Split, build, combined_ops, diagnostics, line_of, split_of

SPLIT_OPS_FNS = ["total", "average", "overall", "per_example", "gram", "gram_einsum", "column_sums", "loss",
                 "scores", "ranked", "mean_score", "weight_total"]


def test_each_function_has_its_batch_axis_split_and_the_axes_that_have_it() -> None:
    checked = build(P.SPLIT_OPS, "cpu[0 1]")
    batch_only = Split(frozenset({"b"}), (0,), None)  # a batch in, its axis reduced away
    assert {name: split_of(checked, name) for name in SPLIT_OPS_FNS} == {
        "total": batch_only, "average": batch_only, "overall": batch_only, "gram": batch_only,
        "gram_einsum": batch_only, "column_sums": batch_only,
        "per_example": Split(frozenset({"b"}), (0,), 0),  # [b] out: each device returns its part
        "loss": Split(frozenset({"b"}), (None, 0), None),  # the model whole, the batch split
        # the split follows batch.x into the callee's own generic dim, through two calls
        "mean_score": Split(frozenset({"b"}), (None, 0), None),
        "ranked": Split(frozenset({"k"}), (None, 0), 0),
        "scores": Split(frozenset({"n"}), (None, 0), 0),
        "weight_total": Split(frozenset(), (None,), None),  # given no batch: nothing split
    }


def test_one_device_has_no_split() -> None:
    checked = build(P.SPLIT_OPS, "cpu")
    assert [split_of(checked, name) for name in SPLIT_OPS_FNS] == [None] * len(SPLIT_OPS_FNS)
    assert combined_ops(checked) == []


def test_a_controller_loop_loads_its_batch_split_but_takes_its_arguments_whole() -> None:
    checked = build(P.LINEAR, "cpu[0 1]")
    assert split_of(checked, "fit") == Split(frozenset({"b"}), (None, None, None, None), None)
    assert split_of(checked, "step") == Split(frozenset({"b"}), (None, None, 0), None)


def test_the_operations_combined_across_the_batch_and_only_those() -> None:
    """Reductions over the batch axis and contractions over it are combined; `batch.x @ m.w`
    (over D), a sum over D and the model's own sum work on each device's part alone."""
    checked = build(P.SPLIT_OPS, "cpu[0 1]")
    at = {name: line_of(P.SPLIT_OPS, f"fn {name}(") for name in SPLIT_OPS_FNS}
    assert combined_ops(checked) == [
        ("sum", at["total"]), ("mean", at["average"]), ("mean", at["overall"]), ("@", at["gram"]),
        ("einsum", at["gram_einsum"]), ("reduce", at["column_sums"]), ("cross_entropy", at["loss"]),
        ("mean", at["mean_score"])]


def test_the_same_operations_are_combined_on_three_devices() -> None:
    assert combined_ops(build(P.SPLIT_OPS, "cpu[0 1 2]")) == combined_ops(build(P.SPLIT_OPS, "cpu[0 1]"))


def test_the_readme_combines_only_its_loss() -> None:
    """forward's `@`s contract over D and Hd, never the batch: only cross_entropy all-reduces."""
    checked = build(P.README, "cpu[0 1]")
    assert combined_ops(checked) == [("cross_entropy", line_of(P.README, "cross_entropy("))]
    assert split_of(checked, "forward") == Split(frozenset({"b"}), (None, 0), 0)


@pytest.mark.parametrize(("source", "what", "column"), [
    (P.MAX_OVER_BATCH, "`max`", 30),
    (P.SOFTMAX_OVER_BATCH, "`softmax`", 32),
    (P.REDUCE_MAX_OVER_BATCH, "`reduce` with max", 30),
])
def test_an_operation_across_the_batch_without_a_lowering_is_E1801(source: str, what: str, column: int) -> None:
    [d] = diagnostics(source, "cpu[0 1]")
    assert (d.code, d.span.line, d.span.col) == ("E1801", line_of(source, "fn f("), column)
    assert d.message == f"{what} across the batch axis has no lowering for several devices"
    build(source, "cpu")  # one device: the whole batch is there


@pytest.mark.parametrize(("source", "message", "column"), [
    (P.BATCH_GROUPED, "the batch axis is grouped with another in [(b D)], so it can't stay split across the "
                      "devices", 34),
    (P.BATCH_TWICE, "[b b] has the batch axis twice", 32),
    (P.FIXED_BATCH, "a batch of a fixed size, [8] Ex, can't be split across 2 devices", 6),
    (P.BATCH_SIZE_AS_NUMBER, "`b`, the batch's size, as a number would be each device's part's size", 44),
])
def test_a_batch_axis_that_cant_stay_split_is_E1802(source: str, message: str, column: int) -> None:
    [d] = diagnostics(source, "cpu[0 1]")
    assert (d.code, d.message, d.span.line, d.span.col) == ("E1802", message, line_of(source, "fn f("), column)
    build(source, "cpu")


def test_a_call_binding_a_dim_to_arithmetic_of_the_batch_axis_is_E1802_at_the_call() -> None:
    source = P.BATCH_IN_ARITHMETIC
    found = diagnostics(source, "cpu[0 1]")
    line = line_of(source, "fn f(")
    at_call = (line, source.splitlines()[line - 1].index("g(repeat") + 1)
    assert {d.code for d in found} == {"E1802"}
    assert [d.message for d in found if (d.span.line, d.span.col) == at_call][0] == \
        "the batch axis as part of 2*b can't stay split"
    build(source, "cpu")


def test_a_function_given_split_and_whole_values_is_E1804_at_the_whole_one() -> None:
    source = P.SPLIT_AND_WHOLE
    [d] = diagnostics(source, "cpu[0 1]")
    line = line_of(source, "fn f(")
    text = source.splitlines()[line - 1]
    assert (d.code, d.span.line, d.span.col) == ("E1804", line, text.index("g(w)") + 1)
    assert d.message == "`g` takes a split value in one call and a whole one in another"
    assert d.help[0] == f"the value with the batch axis is passed at {FILE}:{line}:{text.index('g(batch.x)') + 1}"
    build(source, "cpu")


@pytest.mark.parametrize(("source", "arg", "shown"), [
    (P.PYTHON_GETS_FIELD, "batch.x", "[b D]"),
    (P.PYTHON_GETS_BATCH, "batch", "[b] Ex"),
])
def test_a_python_call_given_split_data_is_E1901_at_the_argument(source: str, arg: str, shown: str) -> None:
    [d] = diagnostics(source, "cpu[0 1]")
    line = line_of(source, f"show({arg})")
    assert (d.code, d.span.line, d.span.col) == ("E1901", line, source.splitlines()[line - 1].index(arg) + 1)
    assert d.message.startswith("the Python function `show` would get split data")
    assert d.label == f"this is {shown}, split across the devices"
    build(source, "cpu")
