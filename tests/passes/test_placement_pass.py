"""The placement pass (plan/placement.py): where each function runs, for the reason the manual
gives, and E1803 for device work in a function that runs in the controller."""

from __future__ import annotations

import pytest
from facts import FILE, build, diagnostics, line_of
from programs import LIN_HEADER, PLACES, PRINTING_STEP, SHOWING_STEP, TRAINING_LOOP

from shapescript.check.program import Placement

# Each function of PLACES: where it runs, and why (the manual's list, "Where functions run").
EXPECTED = {
    "helper_matrix": ("controller", "is a Python function"),
    "ln": ("workers", "works on each example"),
    "twice": ("anywhere", ""),  # a function of ints
    "scores": ("workers", "uses tensors"),
    "normed": ("workers", "uses tensors"),  # calls an extern fn: per example, on the workers
    "loss": ("workers", "uses tensors"),
    "step": ("workers", "uses tensors"),
    "show": ("controller", "prints"),
    "show_twice": ("controller", "calls `show`, which runs there"),
    "show_through": ("controller", "calls `show_twice`, which runs there"),  # callers' callers too
    "keep": ("controller", "saves a checkpoint"),
    "restore": ("controller", "loads a checkpoint"),
    "record": ("controller", "writes to a sink"),
    "with_helper": ("controller", "calls Python"),
    "count": ("controller", "takes a dataset"),
    "to_sink": ("controller", "takes a sink"),
    # it loops, takes a dataset and a sink and writes: the first of the manual's reasons is given
    "fit": ("controller", "loops over a dataset"),
}


@pytest.mark.parametrize("devices", ["cpu", "cpu[0 1]"])
def test_each_function_runs_where_the_manual_says_and_why(devices: str) -> None:
    checked = build(PLACES, devices)
    assert {name: (checked.placement(name).where, checked.placement(name).reason) for name in checked.fns} == EXPECTED


def test_a_function_of_ints_stays_anywhere_whoever_calls_it() -> None:
    """`twice` is called from the controller (`count`) and a function of ints called from the
    workers is as free: placement never moves a callee to its caller."""
    source = PLACES + "\nfn on_workers(x: [b D]) -> [b D] = x * twice(3)\n"
    checked = build(source, "cpu[0 1]")
    assert checked.placement("on_workers").where == "workers"
    assert checked.placement("twice").where == "anywhere"


def test_a_function_taking_a_model_only_runs_on_the_workers() -> None:
    checked = build(LIN_HEADER + "\nfn copy(m: Lin) -> [D C] = m.w\n", "cpu")
    assert checked.placement("copy") == Placement("workers", "uses tensors")


def test_a_step_that_prints_is_E1803_at_the_print_with_the_device_work_in_notes() -> None:
    [d] = diagnostics(PRINTING_STEP, "cpu[0 1]")
    assert d.code == "E1803"
    assert d.message == "`step` does device work, but it prints, so it runs in the controller"
    assert (d.span.line, d.span.col) == (line_of(PRINTING_STEP, "print(l)"), 5)
    assert d.help == ("move `print` out of `step` into the loop in the controller that calls it; "
                      "`step` can return the values it needs",)
    assert d.notes == (
        f"`value_and_grad` at {FILE}:{line_of(PRINTING_STEP, 'value_and_grad')}:12 is device work, "
        "which runs on the workers",
        f"`update` at {FILE}:{line_of(PRINTING_STEP, 'update(')}:5 is device work, which runs on the workers")


def test_a_step_that_calls_a_controller_function_is_E1803_at_the_call() -> None:
    [d] = diagnostics(SHOWING_STEP, "cpu[0 1]")
    assert d.code == "E1803"
    assert d.message == "`step` does device work, but it calls `show`, which runs in the controller"
    assert (d.span.line, d.span.col) == (line_of(SHOWING_STEP, "show(l)"), 5)
    assert d.help[0].startswith("move the call of `show` out of `step`")


def test_training_in_the_loop_itself_is_E1803_at_each_piece_of_device_work() -> None:
    """The loop stays in the controller, so the device work moves out, each piece reported."""
    found = diagnostics(TRAINING_LOOP, "cpu[0 1]")
    assert [(d.code, d.span.line) for d in found] == [
        ("E1803", line_of(TRAINING_LOOP, "value_and_grad")), ("E1803", line_of(TRAINING_LOOP, "update("))]
    assert [d.message for d in found] == [
        "`value_and_grad` is device work, but `fit` runs in the controller",
        "`update` is device work, but `fit` runs in the controller"]
    assert all(d.help[0] == "`fit` runs in the controller because it loops over a dataset" for d in found)


@pytest.mark.parametrize("source", [PRINTING_STEP, SHOWING_STEP, TRAINING_LOOP])
def test_on_one_device_device_work_in_the_controller_compiles(source: str) -> None:
    """One device has no workers: the function just runs in the controller."""
    checked = build(source, "cpu")
    placed = [fn for fn in checked.fns.values() if fn.device_work]
    assert placed and all(checked.placement(fn.name).where == "controller" for fn in placed)
