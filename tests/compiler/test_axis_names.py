"""Every message that names an axis by position says `dim k`, with k counted as PyTorch counts it:
the bad tensor's `.shape[k]` is the wrong size. The reference is the tensor itself (or, at
compile time, the shape its declared type gives): the test finds the wrong axis by comparing shapes,
then reads the number from the message."""

from __future__ import annotations

import re

import pytest
import torch

import shapescript as ss
from shapescript.errors import CompileError, ShapeError
from shapescript.pipeline import check_source

SIZES = {"P": 2, "Q": 3, "R": 5, "Z": 7}
DIMS = "".join(f"dim {name} = {size}\n" for name, size in SIZES.items())
DECLARED = ["P", "Q", "R"]


def first_difference(got: tuple[int, ...], want: tuple[int, ...]) -> int:
    """The reference: the first index where two shapes of one rank differ."""
    assert len(got) == len(want)
    return next(k for k, (g, w) in enumerate(zip(got, want)) if g != w)


def dim_in(message: str) -> tuple[int, int, str]:
    """The `dim K is N, not LABEL` a message names: (K, N, what follows `not`)."""
    found = re.findall(r"\bdim (\d+) is (\w+), not ([^;(\n]+)", message)
    assert len(found) == 1, message
    k, size, label = found[0]
    assert not re.search(r"\baxis \d", message), message  # no 1-based wording left beside it
    return int(k), size, label.strip()


def with_axis_replaced(k: int) -> list[str]:
    names = list(DECLARED)
    names[k] = "Z"
    return names


@pytest.mark.parametrize("k", [0, 1, 2], ids=["first", "middle", "last"])
def test_compile_time_argument_names_the_dim_pytorch_counts(k: int) -> None:
    passed = with_axis_replaced(k)
    source = (DIMS + f"\nfn g(x: [{' '.join(DECLARED)}]) -> [] = sum(x)\n\n"
              f"fn f(x: [{' '.join(passed)}]) -> [] = g(x)\n")
    with pytest.raises(CompileError) as info:
        check_source(source, "t.ss")
    [d] = info.value.diagnostics
    assert d.code == "E0301"
    got = tuple(SIZES[n] for n in passed)  # what `x` of `f` is as a tensor
    want = tuple(SIZES[n] for n in DECLARED)
    number, size, label = dim_in(d.label)
    assert number == first_difference(got, want)
    assert (size, label) == (passed[number], DECLARED[number])


@pytest.mark.parametrize("k", [0, 1, 2], ids=["first", "middle", "last"])
def test_compile_time_result_names_the_dim(k: int) -> None:
    returned = with_axis_replaced(k)
    source = DIMS + f"\nfn f(x: [{' '.join(returned)}]) -> [{' '.join(DECLARED)}] = x\n"
    with pytest.raises(CompileError) as info:
        check_source(source, "t.ss")
    [d] = info.value.diagnostics
    assert d.code == "E0305"
    number, size, label = dim_in(d.label)
    assert number == first_difference(tuple(SIZES[n] for n in returned), tuple(SIZES[n] for n in DECLARED))
    assert (size, label) == ("Z", DECLARED[number])


@pytest.fixture(scope="module")
def prog() -> ss.Program:
    return ss.load(DIMS + "\ndata Ex:\n    img: [Q R]\n    label: [Q]\n\n"
                   "fn f(x: [P Q R]) -> [] = sum(x)\n\n"
                   "fn pair(x: [n Q], y: [n Q]) -> [n Q] = x + y\n\n"
                   "fn g(batch: [b] Ex) -> [b] = sum(batch.label, over=Q)\n\n"
                   "fn both(x: [b Q], batch: [b] Ex) -> [b] = sum(x + batch.label, over=Q)\n",
                   devices="cpu", name="axes.ss")


@pytest.mark.parametrize("k", [0, 1, 2], ids=["first", "middle", "last"])
def test_run_time_argument_names_the_dim_and_its_size(prog: ss.Program, k: int) -> None:
    want = (SIZES["P"], SIZES["Q"], SIZES["R"])
    bad = torch.zeros(*(SIZES["Z"] if i == k else n for i, n in enumerate(want)))
    with pytest.raises(ShapeError) as info:
        prog.f(bad)
    number, size, label = dim_in(str(info.value))
    assert number == first_difference(tuple(bad.shape), want)
    assert int(size) == bad.shape[number]
    assert label == f"{DECLARED[number]} = {want[number]}"


def test_run_time_generic_dim_names_its_binding(prog: ss.Program) -> None:
    x, y = torch.zeros(4, SIZES["Q"]), torch.zeros(6, SIZES["Q"])
    with pytest.raises(ShapeError) as info:
        prog.pair(x, y)
    number, size, label = dim_in(str(info.value))
    assert number == first_difference(tuple(y.shape), (x.shape[0], SIZES["Q"]))
    assert (int(size), label) == (y.shape[number], f"n = {x.shape[0]}")
    assert "`y` of `pair`" in str(info.value)


@pytest.mark.parametrize("field, shape", [
    ("img", (4, SIZES["Q"], SIZES["Z"])),  # a field's own last axis
    ("img", (4, SIZES["Z"], SIZES["R"])),  # its middle one
    ("label", (5, SIZES["Q"])),  # the batch axis: one row too many for the other field
], ids=["field-last", "field-middle", "field-batch"])
def test_batch_fields_name_the_dim_of_the_field_tensor(prog: ss.Program, field: str, shape: tuple) -> None:
    fields = {"img": torch.zeros(4, SIZES["Q"], SIZES["R"]), "label": torch.zeros(4, SIZES["Q"])}
    want = tuple(fields[field].shape)
    fields[field] = torch.zeros(*shape)
    with pytest.raises(ShapeError) as info:
        prog.g(fields)
    assert f"batch field `{field}`" in str(info.value)
    number, size, _ = dim_in(str(info.value))
    assert number == first_difference(tuple(fields[field].shape), want)
    assert int(size) == fields[field].shape[number]


def test_a_batch_whose_size_disagrees_names_dim_0_of_its_fields(prog: ss.Program) -> None:
    x = torch.zeros(3, SIZES["Q"])
    batch = {"img": torch.zeros(5, SIZES["Q"], SIZES["R"]), "label": torch.zeros(5, SIZES["Q"])}
    with pytest.raises(ShapeError) as info:
        prog.both(x, batch)
    k = first_difference(tuple(batch["label"].shape), (x.shape[0], SIZES["Q"]))
    assert f"b is {batch['label'].shape[k]} in this batch (dim {k} of each field), but {x.shape[0]} before" \
        in str(info.value)


def test_a_padded_dim_names_the_field_and_its_dim() -> None:
    prog = ss.load("dim V = 6\n\ndata Seq:\n    tokens: [n] Index[V]\n\n"
                   "fn both(a: [b] Seq, c: [b] Seq) -> [b n V] = one_hot(a.tokens) + one_hot(c.tokens)\n",
                   devices="cpu", name="pad.ss")
    a, c = torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 4, dtype=torch.int64)
    with pytest.raises(ShapeError) as info:
        prog.both({"tokens": a}, {"tokens": c})
    k = first_difference(tuple(c.shape), tuple(a.shape))
    assert f"n is {c.shape[k]} in this batch (dim {k} of field `tokens`), but {a.shape[k]} before" \
        in str(info.value)
