"""Types are the truth for values from outside: a batch's fields are converted only where
no value can change, anything else is a ShapeError with the fix, the same on one device and on two;
and a python or extern fn's result is checked against the generic dims its arguments bound."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shapescript as ss
from shapescript.api import compile_program
from shapescript.pipeline import python_module

DATA = textwrap.dedent("""\
    devices DEVICES
    dim D = 4
    dim C = 3

    data Digit:
        img: [D]
        label: [] Index[C]

    fn score(batch: [b] Digit) -> [b] = sum(batch.img, over=D) + where(batch.label == 1, 10.0, 0.0)

    fn total(data: Dataset[Digit]) -> []:
        s = to(0.0, f32)
        for batch in data |> batches(2):
            s = s + sum(score(batch), over=b)
        return s
    """)

IMG = torch.tensor([[0.5, 1.0, 2.0, 3.0], [1.0, 0.0, 0.0, 1.0], [4.0, 4.0, 4.0, 4.0], [0.25, 0.0, 1.0, 2.0]])
LABEL = torch.tensor([0, 1, 2, 1])
EXPECTED = IMG.sum(dim=1) + (LABEL == 1) * 10.0  # the same, in PyTorch


@pytest.fixture(params=["cpu", "cpu[0 1]"])
def data_prog(request: pytest.FixtureRequest) -> Iterator[Any]:
    prog = ss.load(DATA.replace("DEVICES", request.param), name="digit.ss")
    try:
        yield prog
    finally:
        prog.stop()


def test_lossless_field_dtypes_are_converted(data_prog: Any) -> None:
    """u8 and bool features, i32 and u8 labels hold every value exactly as f32 and i64."""
    small = (IMG * 4).to(torch.uint8)
    cases = [({"img": small, "label": LABEL.int()}, small.float().sum(dim=1) + (LABEL == 1) * 10.0),
             ({"img": IMG > 1, "label": LABEL.to(torch.uint8)}, (IMG > 1).sum(dim=1) + (LABEL == 1) * 10.0),
             ({"img": IMG.half(), "label": LABEL}, EXPECTED)]
    for batch, expected in cases:
        assert torch.equal(data_prog.score(batch), expected.float())
    assert data_prog.total(ss.TensorDataset(img=IMG > 1, label=LABEL.int())).item() == pytest.approx(
        float((IMG > 1).sum() + (LABEL == 1).sum() * 10))


FIELD_IMG = (r"^batch field `img`: expected dtype f32, got f64, which can't be converted without changing "
             r"values; convert it with \.to\(torch\.float32\) \(declared at digit\.ss:6:5; the batch goes to "
             r"`batch` of `score` \(digit\.ss:9:10\)\)$")


@pytest.mark.parametrize("img, label, message", [
    (IMG.double(), LABEL, FIELD_IMG),
    (torch.full((4, 4), 1e300, dtype=torch.float64), LABEL, FIELD_IMG),  # once became inf
    (IMG.long(), LABEL, r"^batch field `img`: expected dtype f32, got i64, .*\.to\(torch\.float32\)"),
    (IMG, LABEL.float(), r"^batch field `label`: expected dtype i64, got f32, .*\.to\(torch\.int64\) "
                         r"\(declared at digit\.ss:7:5"),
    (IMG.numpy().astype(np.float64), LABEL, r"^batch field `img`: .*got f64, .*\.astype\(numpy\.float32\)"),
])
def test_lossy_field_dtypes_are_a_shape_error_with_the_fix(data_prog: Any, img: Any, label: Any,
                                                           message: str) -> None:
    with pytest.raises(ss.ShapeError, match=message):
        data_prog.score({"img": img, "label": label})


def test_a_dataset_of_lossy_dtypes_is_refused_as_it_loads(data_prog: Any) -> None:
    """The workers load their items themselves: the same check and message as one device."""
    with pytest.raises(ss.ShapeError, match=r"field `img` of the dataset's items: expected dtype f32, got f64.*"
                                            r"\.to\(torch\.float32\) \(declared at digit\.ss:6:5\)"):
        data_prog.total(ss.TensorDataset(img=IMG.double(), label=LABEL))
    with pytest.raises(ss.ShapeError, match=r"field `label` of the dataset's items: expected dtype i64, got f32"):
        data_prog.total(ss.TensorDataset(img=IMG, label=LABEL.float()))


# ---- results of python and extern fns -------------------------------------------------------------

HELPER = textwrap.dedent("""\
    import torch
    def same(x):
        return x * 2
    def doubled(x):  # 2n rows for n
        return torch.cat([x, x])
    def row_sums(x):
        return torch.cat([x.sum(dim=1), x.sum(dim=1)])
    def batch_sums(batch):
        return row_sums(batch.x)
    """)

RESULTS = textwrap.dedent("""\
    devices DEVICES
    dim D = 3
    extern fn same(x: [n D]) -> [n D] = "ss_truth_helper.same"
    extern fn doubled(x: [n D]) -> [n D] = "ss_truth_helper.doubled"
    python fn row_sums(x: [n D]) -> [n] = "ss_truth_helper.row_sums"
    fn ok(x: [b D]) -> [b D] = same(x)
    fn wrong(x: [b D]) -> [b D] = doubled(x)
    fn sums(x: [b D]) -> [b] = row_sums(x)
    """)

DOUBLED = (r"^`result` of `doubled` \(res\.ss:4:1\): expected \[n D\] with D = 3, got shape \[{rows2}, 3\]; "
           r"dim 0 is {rows2}, not n = {rows}; n was bound to {rows} by `x` of `doubled` \(res\.ss:4:19\)(\n|$)")
ROW_SUMS = (r"^`result` of `row_sums` \(res\.ss:5:1\): expected \[n\], got shape \[8\]; dim 0 is 8, not n = 4; "
            r"n was bound to 4 by `x` of `row_sums` \(res\.ss:5:20\)(\n|$)")


@pytest.fixture()
def helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    (tmp_path / "ss_truth_helper.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("ss_truth_helper", None)
    yield
    sys.modules.pop("ss_truth_helper", None)


@pytest.mark.parametrize("devices", ["cpu", "cpu[0 1]"])
def test_a_result_with_more_rows_than_its_arguments_bound_is_a_shape_error(helper: None, devices: str) -> None:
    prog = ss.load(RESULTS.replace("DEVICES", devices), name="res.ss")
    try:
        x = torch.arange(12.0).reshape(4, 3)
        assert torch.equal(prog.ok(x), x * 2)
        with pytest.raises(ss.ShapeError, match=DOUBLED.format(rows=4, rows2=8)):
            prog.wrong(x)
        with pytest.raises(ss.ShapeError, match=ROW_SUMS):
            prog.sums(x)
    finally:
        prog.stop()


def test_a_batch_argument_binds_its_size_for_the_result(helper: None) -> None:
    """One device only: on several, a python fn given a batch is E1901."""
    prog = ss.load(textwrap.dedent("""\
        dim D = 3
        data Ex:
            x: [D]
        python fn batch_sums(batch: [b] Ex) -> [b] = "ss_truth_helper.batch_sums"
        fn total(batch: [b] Ex) -> [b] = batch_sums(batch)
        """), name="batch.ss")
    with pytest.raises(ss.ShapeError, match=r"^`result` of `batch_sums` \(batch\.ss:4:1\): expected \[b\], got shape "
                                            r"\[8\]; .*b was bound to 4 by `batch` of `batch_sums` \(batch\.ss:4:22\)$"):
        prog.total({"x": torch.ones(4, 3)})


def test_a_result_is_checked_against_its_arguments_in_a_standalone_build(helper: None, tmp_path: Path) -> None:
    path = tmp_path / "res_truth_standalone.py"
    path.write_text(python_module(compile_program(RESULTS.replace("DEVICES", "cpu"), "res.ss"), standalone=True))
    spec = importlib.util.spec_from_file_location("res_truth_standalone", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        x = torch.ones(4, 3)
        assert torch.equal(module.ok(x), x * 2)
        with pytest.raises(module._rt.ShapeError, match=DOUBLED.format(rows=4, rows2=8)):
            module.wrong(x)
        with pytest.raises(module._rt.ShapeError, match=ROW_SUMS):
            module.sums(x)
    finally:
        sys.modules.pop("res_truth_standalone._rt", None)
