"""Checked loading: items, stacked batches, Python batches, datasets, shuffle and batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import shapescript as ss
from shapescript.errors import DomainError, ShapeError
from shapescript.runtime.data import (
    Batch,
    DataSpec,
    FieldSpec,
    TensorDataset,
    batch_fields,
    batch_from_python,
    check_batch,
    check_item,
)
from shapescript.runtime.loops import batches, shuffle


def digits(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


class ListDataset:
    """A plain map-style Python dataset of dict items, without __getitems__."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


class ListItemsDataset(ListDataset):
    """One whose __getitems__ returns a list of items, as torch's own datasets may."""

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return [self.items[i] for i in indices]


# ---- check_item -------------------------------------------------------------------------------

def test_item_is_converted_only_where_no_value_changes(digit: DataSpec) -> None:
    out = check_item(digit, {"img": np.arange(64, dtype=np.uint8), "label": np.int16(9)}, 0)
    assert out["img"].dtype == torch.float32 and torch.equal(out["img"], torch.arange(64.0))
    assert out["label"].dtype == torch.int64 and out["label"].item() == 9
    out = check_item(digit, {"img": torch.arange(64) % 2 == 0, "label": torch.tensor(3, dtype=torch.int32)}, 0)
    assert out["img"].dtype == torch.float32 and out["img"].sum().item() == 32 and out["label"].item() == 3
    with pytest.raises(ShapeError) as info:
        check_item(digit, {"img": np.arange(64, dtype=np.float64), "label": 3}, 0)
    assert str(info.value) == ("field `img` of the dataset's items: expected dtype f32, got f64, which can't be "
                               "converted without changing values; convert it with .astype(numpy.float32) "
                               "(declared at digits.ss:7:5)")
    with pytest.raises(ShapeError, match=r"field `img` .*expected dtype f32, got i64.* \.to\(torch\.float32\)"):
        check_item(digit, {"img": list(range(64)), "label": 3}, 0)  # Python ints read as i64, as torch reads them


def test_read_only_numpy_arrays_are_accepted(digit: DataSpec) -> None:
    img = np.zeros(64, dtype=np.float32)
    img.flags.writeable = False
    assert check_item(digit, {"img": img, "label": 0}, 0)["img"].shape == (64,)


def test_label_outside_index_bound(digit: DataSpec) -> None:
    with pytest.raises(DomainError) as info:
        check_item(digit, {"img": torch.zeros(64), "label": 12}, 17)
    assert str(info.value) == ("item 17 of the dataset: field `label` is 12, outside Index[C] "
                               "with C = 10 (declared at digits.ss:8:5)")
    with pytest.raises(DomainError, match="field `label` is -1, outside Index"):
        check_item(digit, {"img": torch.zeros(64), "label": -1}, 0)


def test_wrong_item_shape(digit: DataSpec) -> None:
    with pytest.raises(ShapeError) as info:
        check_item(digit, {"img": torch.zeros(63), "label": 1}, 3)
    assert str(info.value) == ("item 3 of the dataset: field `img` has shape [63], expected [D] "
                               "with D = 64; dim 0 is 63, not D = 64 (declared at digits.ss:7:5)")
    with pytest.raises(ShapeError, match=r"field `label` has shape \[1\], expected \[\]"):
        check_item(digit, {"img": torch.zeros(64), "label": [1]}, 3)


@pytest.mark.parametrize("label", [3.0, 2.5, float("nan"), torch.tensor(7.25)])
def test_float_label_is_refused_whatever_its_value(digit: DataSpec, label: Any) -> None:
    with pytest.raises(ShapeError, match=r"^field `label` of the dataset's items: expected dtype i64, got f32, "
                                         r"which can't .* with \.to\(torch\.int64\) \(declared at digits.ss:8:5\)$"):
        check_item(digit, {"img": torch.zeros(64), "label": label}, 4)


def test_missing_extra_and_malformed_items(digit: DataSpec) -> None:
    with pytest.raises(ShapeError, match=r"^item 2 of the dataset has no field `label` "
                                         r"\(declared at digits.ss:8:5\)$"):
        check_item(digit, {"img": torch.zeros(64)}, 2)
    with pytest.raises(ShapeError, match="item 2 of the dataset has a field `pixels` that Digit "
                                         "does not declare"):
        check_item(digit, {"img": torch.zeros(64), "label": 1, "pixels": 0}, 2)
    with pytest.raises(ShapeError, match="item 2 of the dataset is a tuple, expected a mapping "
                                         "with the fields of Digit"):
        check_item(digit, (torch.zeros(64), 1), 2)
    with pytest.raises(ShapeError, match="field `img` is a list that is not an array"):
        check_item(digit, {"img": [[1.0, 2.0], [3.0]], "label": 1}, 2)
    with pytest.raises(ShapeError, match="field `label` is a str that is not an array"):
        check_item(digit, {"img": torch.zeros(64), "label": "seven"}, 2)


def test_generic_dims_bind_across_fields(seq: DataSpec) -> None:
    out = check_item(seq, {"tokens": [1, 2, 3], "mask": [1.0, 1.0, 0.0]}, 0)
    assert out["tokens"].tolist() == [1, 2, 3] and out["mask"].dtype == torch.float32
    with pytest.raises(ShapeError) as info:
        check_item(seq, {"tokens": [1, 2, 3], "mask": [1.0, 1.0]}, 5)
    assert str(info.value) == ("item 5 of the dataset: field `mask` has shape [2], expected [n] "
                               "with n = 3 (bound by field `tokens`); dim 0 is 2, not n = 3 (declared at digits.ss:4:5)")


def test_index_error_inside_a_sequence_names_the_position(seq: DataSpec) -> None:
    with pytest.raises(DomainError, match=r"item 1 of the dataset: field `tokens` holds 70 at "
                                          r"\[2\], outside Index\[V\] with V = 50"):
        check_item(seq, {"tokens": [1, 2, 70, 99], "mask": [0.0] * 4}, 1)


def test_bool_and_narrow_int_fields() -> None:
    spec = DataSpec("Flags", (
        FieldSpec("on", (), torch.bool, None, None, "f.ss:2:5", "[] bool"),
        FieldSpec("k", (), torch.int32, None, None, "f.ss:3:5", "[] i32"),
    ), "f.ss:1:1")
    out = check_item(spec, {"on": True, "k": np.int16(5)}, 0)
    assert out["on"].dtype == torch.bool and out["on"].item() is True
    assert out["k"].dtype == torch.int32 and out["k"].item() == 5
    with pytest.raises(ShapeError, match=r"field `on` .*expected dtype bool, got i64.*\.to\(torch\.bool\)"):
        check_item(spec, {"on": 1, "k": np.int16(0)}, 0)
    for k in (2**32, 5, 5.0):  # i64 (a Python int) and f32 don't fit in i32 whatever the value
        with pytest.raises(ShapeError, match=r"field `k` .*expected dtype i32, got (i64|f32)"):
            check_item(spec, {"on": True, "k": k}, 0)


# ---- check_batch and batch_from_python ---------------------------------------------------------

def test_check_batch_accepts_and_converts(digit: DataSpec) -> None:
    x, y = digits(4)
    out = check_batch(digit, {"img": x.half().float(), "label": y.int()}, [9, 3, 5, 1])
    assert torch.equal(out["img"], x.half().float()) and torch.equal(out["label"], y)
    out = check_batch(digit, {"img": x.half(), "label": y.to(torch.uint8)}, [9, 3, 5, 1])
    assert torch.equal(out["img"], x.half().float()) and out["label"].dtype == torch.int64
    for img, label in ((x.double(), y), (x, y.float())):
        with pytest.raises(ShapeError, match="of the dataset's items: expected dtype"):
            check_batch(digit, {"img": img, "label": label}, [9, 3, 5, 1])


def test_check_batch_names_the_offending_dataset_index(digit: DataSpec) -> None:
    x, y = digits(8)
    y[5] = 10
    with pytest.raises(DomainError) as info:
        check_batch(digit, {"img": x, "label": y}, [40, 41, 42, 43, 44, 45, 46, 47])
    assert str(info.value) == ("item 45 of the dataset: field `label` is 10, outside Index[C] "
                               "with C = 10 (declared at digits.ss:8:5)")
    y[5] = 0
    with pytest.raises(ShapeError, match=r"item 40 of the dataset: field `img` has shape \[63\], "
                                         r"expected \[D\] with D = 64"):
        check_batch(digit, {"img": x[:, :63], "label": y}, range(40, 48))
    with pytest.raises(ShapeError, match="field `label` has 7 rows for the 8 items of the batch"):
        check_batch(digit, {"img": x, "label": y[:7]}, range(40, 48))


def test_batch_from_python(digit: DataSpec) -> None:
    x, y = digits(32)
    batch = batch_from_python(digit, {"img": x, "label": y}, "train.ss:14:20")
    assert batch.size == 32 and batch.img is x and batch.label is y and batch.spec is digit
    assert batch_from_python(digit, batch, "train.ss:14:20") is batch
    assert list(batch_fields(batch)) == ["img", "label"]
    assert repr(batch) == "Batch[32] Digit(img: [32, 64] f32, label: [32] i64)"


def test_batch_from_python_errors(digit: DataSpec, seq: DataSpec) -> None:
    x, y = digits(32)
    where = "train.ss:14:20"
    with pytest.raises(ShapeError) as info:
        batch_from_python(digit, {"img": x[:, :63], "label": y}, where)
    assert str(info.value) == ("batch field `img` has shape [32, 63], expected [b D] with D = 64; "
                               "dim 1 is 63, not D = 64 (declared at digits.ss:7:5; the batch goes to train.ss:14:20)")
    with pytest.raises(ShapeError, match=r"batch field `label` has shape \[31\], expected \[b\] "
                                         r"with b = 32 \(bound by field `img`\)"):
        batch_from_python(digit, {"img": x, "label": y[:31]}, where)
    y[7] = 11
    with pytest.raises(DomainError, match=r"batch field `label` holds 11 at \[7\], outside "
                                          r"Index\[C\] with C = 10"):
        batch_from_python(digit, {"img": x, "label": y}, where)
    with pytest.raises(ShapeError, match="expected a batch of Digit .* got a batch of Seq"):
        batch_from_python(digit, Batch(seq, {"tokens": torch.zeros(2, 3, dtype=torch.int64),
                                             "mask": torch.ones(2, 3)}), where)
    with pytest.raises(ShapeError, match="is empty"):
        batch_from_python(digit, {"img": x[:0], "label": y[:0]}, where)
    with pytest.raises(ShapeError, match="batch is a list, expected a mapping"):
        batch_from_python(digit, [x, y], where)


# ---- datasets, shuffle, batches -----------------------------------------------------------------

def test_tensor_dataset() -> None:
    x, y = digits(10)
    ds = TensorDataset(img=x, label=y)
    assert len(ds) == 10
    item = ds[3]
    assert torch.equal(item["img"], x[3]) and item["label"] == y[3]
    got = ds.__getitems__([4, 0, 4])
    assert torch.equal(got["img"], x[[4, 0, 4]]) and torch.equal(got["label"], y[[4, 0, 4]])
    with pytest.raises(IndexError):
        ds[10]
    with pytest.raises(ShapeError, match="field `label` has 9 rows, but `img` has 10"):
        TensorDataset(img=x, label=y[:9])
    with pytest.raises(ShapeError, match="field `label` is a scalar"):
        TensorDataset(img=x, label=3)
    assert len(TensorDataset(img=np.zeros((5, 2)))) == 5


def test_shuffle_uses_torch_randperm() -> None:
    x, y = digits(50)
    ds = TensorDataset(img=x, label=y)
    perm = torch.randperm(50, generator=torch.Generator().manual_seed(7))
    view = shuffle(ds, seed=7)
    assert len(view) == 50
    assert all(torch.equal(view[i]["img"], x[perm[i]]) for i in range(50))
    got = view.__getitems__([0, 1, 2])
    assert torch.equal(got["label"], y[perm[:3]])
    plain = shuffle(ListDataset([{"i": i} for i in range(50)]), seed=7)
    assert plain.__getitems__([0, 1]) == [{"i": int(perm[0])}, {"i": int(perm[1])}]
    with pytest.raises(TypeError, match="seed must be an int"):
        shuffle(ds, seed=0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="map-style dataset"):
        shuffle(iter([]), seed=0)


def expected_batches(x: torch.Tensor, y: torch.Tensor, order: torch.Tensor, n: int
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x[order[s:s + n]], y[order[s:s + n]]) for s in range(0, len(order), n)]


def items_of(x: torch.Tensor, y: torch.Tensor) -> list[dict[str, Any]]:
    return [{"img": x[i].numpy(), "label": int(y[i])} for i in range(len(x))]


@pytest.mark.parametrize("kind", ["tensor", "list", "list-getitems"])
def test_batches_of_a_shuffled_dataset(digit: DataSpec, kind: str) -> None:
    x, y = digits(150)
    ds = {"tensor": lambda: TensorDataset(img=x, label=y),
          "list": lambda: ListDataset(items_of(x, y)),
          "list-getitems": lambda: ListItemsDataset(items_of(x, y))}[kind]()
    order = torch.randperm(150, generator=torch.Generator().manual_seed(3))
    got = batches(shuffle(ds, seed=3), 64, digit)
    assert len(got) == 3
    for _ in range(2):  # re-iterable, same batches each time
        seen = list(got)
        assert [b.size for b in seen] == [64, 64, 22]
        for b, (ex, ey) in zip(seen, expected_batches(x, y, order, 64)):
            assert isinstance(b, Batch) and b.spec is digit
            assert torch.equal(b.img, ex) and torch.equal(b.label, ey)
            assert b.label.dtype == torch.int64


def test_nested_shuffles_compose(digit: DataSpec) -> None:
    x, y = digits(20)
    p1 = torch.randperm(20, generator=torch.Generator().manual_seed(1))
    p2 = torch.randperm(20, generator=torch.Generator().manual_seed(2))
    view = shuffle(shuffle(TensorDataset(img=x, label=y), seed=1), seed=2)
    (b,) = list(batches(view, 32, digit))
    assert torch.equal(b.img, x[p1[p2]])


def test_batches_edge_cases(digit: DataSpec) -> None:
    x, y = digits(5)
    ds = TensorDataset(img=x, label=y)
    assert [b.size for b in batches(ds, 2, digit)] == [2, 2, 1]
    assert list(batches(TensorDataset(img=x[:0], label=y[:0]), 4, digit)) == []
    with pytest.raises(DomainError, match="batch size must be positive, got 0"):
        batches(ds, 0, digit)
    with pytest.raises(TypeError, match="the batch size must be an int"):
        batches(ds, 2.0, digit)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["tensor", "list"])
def test_batches_name_the_base_dataset_index(digit: DataSpec, kind: str) -> None:
    x, y = digits(100)
    y[61] = 10
    ds = TensorDataset(img=x, label=y) if kind == "tensor" else ListDataset(items_of(x, y))
    with pytest.raises(DomainError, match=r"^item 61 of the dataset: field `label` is 10, "
                                          r"outside Index\[C\] with C = 10"):
        for _ in batches(shuffle(ds, seed=5), 16, digit):
            pass


def test_items_of_one_batch_are_padded_along_generic_dims(seq: DataSpec) -> None:
    ds = ListDataset([{"tokens": [1, 2], "mask": [1.0, 1.0]},
                      {"tokens": [1, 2, 3], "mask": [1.0, 1.0, 1.0]}])
    (batch,) = list(batches(ds, 2, seq))
    assert batch.tokens.tolist() == [[1, 2, 0], [1, 2, 3]]
    assert batch.mask.tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    assert batch.lengths["n"].tolist() == [2, 3]
    assert [b.tokens.shape for b in batches(ds, 1, seq)] == [(1, 2), (1, 3)]


LOOP = """\
dim D = 2
dim C = 3

data Row:
    x: [D]
    y: [] Index[C]

fn run(data: Dataset[Row], log: Sink):
    for batch in data |> shuffle(seed=1) |> batches(2):
        write(log, logs(x=sum(batch.x), y=sum(to(batch.y, f32))))
"""


def test_a_tensor_dataset_checked_whole_is_trusted_until_a_field_changes() -> None:
    """The loop checks a TensorDataset whole once and then gathers its batches unchecked; a field
    changed in place (its version moves) or replaced is checked again, and a bad item is then the
    error of its batch, as it always was."""
    prog = ss.load(LOOP, name="loop.ss")
    x, y = torch.arange(10.0).reshape(5, 2), torch.tensor([0, 1, 2, 0, 1])
    data = ss.TensorDataset(x=x, y=y)
    sink = ss.sinks.memory()
    prog.run(data, sink)
    assert sum(r["x"] for r in sink.records) == pytest.approx(45.0) and sum(r["y"] for r in sink.records) == 4.0
    assert data.fits_as_given(prog.Row)
    y[3] = 7  # in place: out of Index[C]
    assert not data.fits_as_given(prog.Row)
    with pytest.raises(ss.DomainError, match="item 3 of the dataset"):
        prog.run(data, ss.sinks.memory())
    y[3] = 2
    assert data.fits_as_given(prog.Row)
    data.fields["x"] = torch.zeros(5, 3)  # replaced, with another shape
    with pytest.raises(ss.ShapeError):
        prog.run(data, ss.sinks.memory())


def test_a_loops_order_lives_where_its_tensor_dataset_does() -> None:
    """A shuffled loop over a TensorDataset slices its batches' indices from an order made once a pass
    on the dataset's own device (a GPU's dataset: no upload of indices at each step); its fields on
    different devices, or a dataset on the CPU, keep the order on the CPU. The meta device stands in
    for a GPU (a tensor there has a device and a shape, no data; put in the fields by hand, since a
    TensorDataset refuses one)."""
    prog = ss.load(LOOP, name="loop.ss")
    on_meta = ss.TensorDataset(x=torch.zeros(5, 2), y=torch.zeros(5, dtype=torch.long))
    on_meta.fields = {name: t.to("meta") for name, t in on_meta.fields.items()}
    assert on_meta.home == torch.device("meta")
    order = batches(shuffle(on_meta, seed=1), 2, prog.Row).order_tensor
    assert order.device.type == "meta" and order.shape == (5,)
    mixed = ss.TensorDataset(x=torch.zeros(5, 2), y=torch.zeros(5, dtype=torch.long))
    mixed.fields["x"] = mixed.fields["x"].to("meta")
    assert mixed.home is None
    assert batches(shuffle(mixed, seed=1), 2, prog.Row).order_tensor.device.type == "cpu"
    on_cpu = ss.TensorDataset(x=torch.zeros(5, 2), y=torch.zeros(5, dtype=torch.long))
    cpu_order = batches(shuffle(on_cpu, seed=1), 2, prog.Row).order_tensor
    assert cpu_order.device.type == "cpu" and sorted(cpu_order.tolist()) == list(range(5))
