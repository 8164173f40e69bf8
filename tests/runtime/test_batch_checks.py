"""A batch that needs nothing converted or refused takes a short way through the checks
(runtime/data.py's `as_given`, on a call's path from Python); every other batch takes the full check. Both
ways must agree: for each batch here, right or wrong, the result (or the error, class and words) with
the short way is what the full check alone gives."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from shapescript.runtime import data, guards
from shapescript.runtime.data import DataSpec, FieldSpec, batch_from_python, check_batch
from shapescript.runtime.guards import AxisCheck, BatchGuard, Param

DIGIT = DataSpec("Digit", (
    FieldSpec("img", (("D", 4),), torch.float32, None, None, "t.ss:2:5", "[D]"),
    FieldSpec("label", (), torch.int64, 3, "C", "t.ss:3:5", "[] Index[C]"),
), "t.ss:1:1")
PIXELS = DataSpec("Pixels", (
    FieldSpec("grid", (("H", 2), ("W", 3)), torch.float32, None, None, "t.ss:5:5", "[H W]"),
), "t.ss:4:1")
LINE = DataSpec("Line", (  # a generic dim: always the full check
    FieldSpec("tokens", (("n", None),), torch.int64, 5, "V", "t.ss:7:5", "[n] Index[V]"),
), "t.ss:6:1")

IMG, LABEL = torch.randn(6, 4), torch.tensor([0, 1, 2, 2, 1, 0])
BATCHES: dict[str, tuple[DataSpec, Any]] = {
    "right": (DIGIT, {"img": IMG, "label": LABEL}),
    "right, fields in another order": (DIGIT, {"label": LABEL, "img": IMG}),
    "a grid": (PIXELS, {"grid": torch.zeros(5, 2, 3)}),
    "a label out of its Index": (DIGIT, {"img": IMG, "label": torch.tensor([0, 1, 3, 2, 1, 0])}),
    "a negative label": (DIGIT, {"img": IMG, "label": torch.tensor([0, -1, 2, 2, 1, 0])}),
    "int32 labels, converted": (DIGIT, {"img": IMG, "label": LABEL.int()}),
    "float64 images, refused": (DIGIT, {"img": IMG.double(), "label": LABEL}),
    "numpy images": (DIGIT, {"img": IMG.numpy(), "label": LABEL}),
    "lists": (DIGIT, {"img": IMG.tolist(), "label": LABEL.tolist()}),
    "a wrong width": (DIGIT, {"img": torch.randn(6, 5), "label": LABEL}),
    "rows that disagree": (DIGIT, {"img": torch.randn(5, 4), "label": LABEL}),
    "a scalar label": (DIGIT, {"img": IMG, "label": torch.tensor(1)}),
    "a field missing": (DIGIT, {"img": IMG}),
    "a field too many": (DIGIT, {"img": IMG, "label": LABEL, "extra": LABEL}),
    "a meta tensor": (DIGIT, {"img": torch.empty(6, 4, device="meta"), "label": LABEL}),
    "a sparse tensor": (DIGIT, {"img": IMG.to_sparse(), "label": LABEL}),
    "a Parameter": (DIGIT, {"img": torch.nn.Parameter(IMG), "label": LABEL}),
    "not a dict": (DIGIT, [IMG, LABEL]),
    "a generic dim": (LINE, {"tokens": torch.tensor([[1, 2], [3, 4]])}),
    "a generic dim out of its Index": (LINE, {"tokens": torch.tensor([[1, 7]])}),
    "an empty batch": (DIGIT, {"img": torch.zeros(0, 4), "label": torch.zeros(0, dtype=torch.int64)}),
}


def outcome(check: Any) -> tuple[str, Any]:
    try:
        result = check()
    except Exception as e:
        return type(e).__name__, str(e)
    fields = data.batch_fields(result) if isinstance(result, data.Batch) else result
    return "ok", {k: (v.dtype, tuple(v.shape), v.tolist()) for k, v in fields.items()}


def both_ways(check: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[str, Any], tuple[str, Any]]:
    short = outcome(check)
    with monkeypatch.context() as m:
        m.setattr(data, "as_given", lambda *args: None)
        full = outcome(check)
    return short, full


@pytest.mark.parametrize("name", BATCHES)
def test_a_batch_from_python_gets_what_the_full_check_gives(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, value = BATCHES[name]
    short, full = both_ways(lambda: batch_from_python(spec, value, "`batch` of `step` (t.ss:9:1)"), monkeypatch)
    assert short == full


@pytest.mark.parametrize("name", BATCHES)
def test_a_loaded_batch_gets_what_the_full_check_gives(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, value = BATCHES[name]
    rows = 6 if spec is DIGIT else len(next(iter(value.values()))) if isinstance(value, dict) and value else 0
    short, full = both_ways(lambda: check_batch(spec, value, list(range(10, 10 + rows))), monkeypatch)
    assert short == full
    # and a batch whose row count isn't the items' count
    short, full = both_ways(lambda: check_batch(spec, value, [1, 2]), monkeypatch)
    assert short == full


def test_a_right_batch_is_taken_as_it_is_and_a_wrong_one_is_not() -> None:
    batch = {"img": IMG, "label": LABEL}
    given = data.as_given(DIGIT, batch, None)
    assert given is not None and given["img"] is IMG and given["label"] is LABEL  # no copy
    assert data.as_given(DIGIT, {"img": IMG, "label": LABEL.int()}, None) is None
    assert data.as_given(DIGIT, {"img": IMG, "label": torch.tensor([0, 1, 3, 2, 1, 0])}, None) is None
    assert data.as_given(DIGIT, batch, 5) is None  # 6 rows, not 5
    assert data.as_given(LINE, {"tokens": torch.tensor([[1, 2]])}, None) is None  # generic: full check
    assert data.as_given(DIGIT, {"img": np.zeros((6, 4), np.float32), "label": LABEL}, None) is None


BATCH_AXES = {  # the batch parameter's own axis, as a function's type gives it, and what is bound before
    "[b], nothing bound": ((AxisCheck("b", None, "b", None),), {}),
    "[b], b bound to 6": ((AxisCheck("b", None, "b", None),), {"b": (6, "`x`")}),
    "[b], b bound to 4": ((AxisCheck("b", None, "b", None),), {"b": (4, "`x`")}),
    "[6]": ((AxisCheck("6", 6, None, None),), {}),
    "[B] with B = 8": ((AxisCheck("B", 8, None, None),), {}),
}


@pytest.mark.parametrize("axes", BATCH_AXES)
@pytest.mark.parametrize("name", [n for n, (spec, _) in BATCHES.items() if spec is DIGIT])
def test_a_batch_argument_gets_what_the_full_check_gives(name: str, axes: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The argument guard of a batch parameter (runtime/guards.py's BatchGuard) has a short way of its
    own: the same batch, or the same error, and the same dims bound, as with the full check alone."""
    _, value = BATCHES[name]
    checks, bound = BATCH_AXES[axes]
    guard = BatchGuard(Param("step", "batch", "t.ss:9:10"), DIGIT, checks)

    def check() -> tuple[tuple[str, Any], dict]:
        bindings = dict(bound)
        return outcome(lambda: guard(value, bindings)), bindings
    short = check()
    with monkeypatch.context() as m:
        m.setattr(guards, "as_given", lambda *args: None)  # the guard's short way, then the full check's
        m.setattr(data, "as_given", lambda *args: None)
        full = check()
    assert short == full


@pytest.mark.parametrize("name", BATCHES)
def test_a_batch_built_without_copies_is_the_one_as_given_makes(name: str) -> None:
    """`given_rows` and `given_batch` (a call's short way, guards.py's signature checks) take what
    `as_given` takes, and make the Batch that `trusted_batch(spec, as_given(...))` makes."""
    spec, value = BATCHES[name]
    given = data.as_given(spec, value, None)
    rows = data.given_rows(spec, value, None)
    assert (rows >= 0) == (given is not None)
    if given is not None:
        made, reference = data.given_batch(spec, value, rows), data.trusted_batch(spec, given)
        assert (made.spec, made.size, made.lengths) == (reference.spec, reference.size, reference.lengths)
        mine, theirs = data.batch_fields(made), data.batch_fields(reference)
        assert list(mine) == list(theirs) and all(mine[k] is theirs[k] for k in mine)  # the very tensors
        assert made.size == len(value[spec.fields[0].name])
