"""Strange input from Python gets a typed error that says what is wrong, the same on one device as on
several: a hand-made batch's lengths and fields, optimizer settings past the largest float, and
datasets whose length Python or torch can't hold."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import shapescript as ss
from shapescript.errors import DomainError, ShapeError

PROGRAM = """\
dim V = 6
dim D = 3
dim C = 2

data Seq:
    tokens: [n] Index[V]
    targets: [n] Index[V]

data Ex:
    x: [D]
    y: [] Index[C]

model M:
    param emb: [V D] = normal(std=0.5)
    param w: [D C] = normal(std=0.5)

fn avg(m: M, batch: [b] Seq) -> [b D] = mean(embedding(m.emb, batch.tokens), over=n, mask=valid(batch, n))

fn loss(m: M, batch: [b] Ex) -> [] = cross_entropy(batch.x @ m.w, batch.y, over=C)

fn shuffled(m: M, data: Dataset[Ex]) -> []:
    t = to(0.0, f32)
    for batch in data |> shuffle(0) |> batches(2):
        t = t + loss(m, batch)
    return t

fn seeded(m: M, data: Dataset[Ex], seed: int) -> []:
    t = to(0.0, f32)
    for batch in data |> shuffle(seed) |> batches(2):
        t = t + loss(m, batch)
    return t

fn in_order(m: M, data: Dataset[Ex]) -> []:
    t = to(0.0, f32)
    for batch in data |> batches(2):
        t = t + loss(m, batch)
    return t
"""
DEVICES = ["cpu", "cpu[0 1]", "cpu[0 1 2]"]
TOKENS = torch.tensor([[1, 2, 3], [4, 5, 0]])  # the second example is 2 long, padded with a 0


@pytest.fixture(scope="module", params=DEVICES)
def prog(request: pytest.FixtureRequest) -> Iterator[Any]:
    loaded = ss.load(PROGRAM, devices=request.param, name="pad.ss")
    yield loaded
    loaded.stop()


def made(prog: Any, lengths: Any, tokens: torch.Tensor = TOKENS) -> Any:
    return ss.Batch(prog.Seq, {"tokens": tokens, "targets": tokens.clone()}, lengths=lengths)


def test_a_batch_with_right_lengths_averages_each_example_over_its_own_tokens(prog: Any) -> None:
    m = prog.M.init(seed=0)
    emb = m.emb.detach()
    want = torch.stack([emb[[1, 2, 3]].mean(0), emb[[4, 5]].mean(0)])  # by hand: the padding left out
    for lengths in ({"n": torch.tensor([3, 2])}, {"n": [3, 2]}, {"n": torch.tensor([3, 2], dtype=torch.int32)}):
        torch.testing.assert_close(prog.avg(m, made(prog, lengths)).detach(), want)


BAD_LENGTHS = [
    ({"n": torch.tensor([3, -1])}, DomainError, r"ss.Batch(Seq): lengths['n'] holds -1 at [1], outside 0 to 3: "
                                                r"the fields are 3 long along `n` (declared at pad.ss:5:1)"),
    ({"n": [3, 100]}, DomainError, r"lengths['n'] holds 100 at [1], outside 0 to 3"),
    ({"n": torch.tensor([3])}, ShapeError, r"lengths['n'] has shape [1], expected [2]: one length for each of "
                                           r"the batch's 2 examples"),
    ({"n": torch.tensor([3.0, 2.0])}, ShapeError, r"lengths['n'] has dtype f32, expected whole numbers (i64)"),
    ({"n": torch.tensor([True, False])}, ShapeError, r"lengths['n'] has dtype bool"),
    ({"n": "3 2"}, ShapeError, r"lengths['n'] is a str that is not an array of numbers"),
    ({"m": torch.tensor([3, 2])}, ShapeError, r"ss.Batch(Seq): `lengths` names 'm', which is no generic dim of "
                                              r"Seq's fields (those: `n`; declared at pad.ss:5:1)"),
    ({"N": torch.tensor([3, 2])}, ShapeError, r"did you mean `n`?"),
    ([3, 2], ShapeError, r"ss.Batch(Seq): `lengths` is a list, expected a dict from a generic dim's name"),
]


@pytest.mark.parametrize("lengths,error,message", BAD_LENGTHS, ids=lambda v: "" if isinstance(v, str) else None)
def test_bad_lengths_are_refused_as_the_batch_is_made(prog: Any, lengths: Any, error: type[Exception],
                                                      message: str) -> None:
    with pytest.raises(error) as info:
        made(prog, lengths)
    assert type(info.value) is error and message in str(info.value)


def test_a_hand_made_batchs_fields_are_checked_as_a_calls_are(prog: Any) -> None:
    with pytest.raises(DomainError, match=re.escape("ss.Batch(Seq): field `tokens` holds 9 at [0, 1], outside "
                                                    "Index[V] with V = 6 (declared at pad.ss:6:5)")):
        made(prog, None, torch.tensor([[1, 9, 3]]))
    with pytest.raises(ShapeError, match=re.escape("ss.Batch(Seq): field `tokens`: expected dtype i64, got f32")):
        made(prog, None, torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ShapeError, match=re.escape("ss.Batch(Seq) has no field `targets`")):
        ss.Batch(prog.Seq, {"tokens": TOKENS})
    with pytest.raises(ShapeError, match="the batch is empty"):
        made(prog, None, TOKENS[:0])
    with pytest.raises(TypeError, match="expected a program's data type"):
        ss.Batch("Seq", {"tokens": TOKENS, "targets": TOKENS})


@pytest.mark.parametrize("digits", [400, 5000])  # 5000: more digits than Python prints
def test_a_setting_past_the_largest_float_is_a_domain_error(prog: Any, digits: int) -> None:
    value = 10**digits
    m = prog.M.init(seed=0)
    with pytest.raises(DomainError, match=r"adamw: lr must be a finite number >= 0 that fits a float .*not an int "
                                          r"of \d+ bits \(about 10\*\*(400|5000)\)"):
        ss.adamw(m, lr=value)
    with pytest.raises(DomainError, match="sgd: momentum must be a finite number >= 0 that fits a float"):
        ss.sgd(m, momentum=value)


class Huge:
    """A dataset claiming `length` items, each the same right example."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.ones(3), "y": torch.tensor(1)}


def test_a_dataset_too_big_to_shuffle_is_a_domain_error(prog: Any) -> None:
    m = prog.M.init(seed=0)
    with pytest.raises(DomainError, match=r"shuffle: a dataset of 4611686018427387904 items is too big to shuffle "
                                          r"here: its order takes 36,893,488,147,419,103,232 bytes"):
        prog.shuffled(m, Huge(2**62))
    # the program and its workers are as they were: a right dataset runs
    assert prog.shuffled(m, Huge(4)).item() == pytest.approx(2 * prog.loss(m, {"x": torch.ones(2, 3),
                                                                               "y": torch.ones(2, dtype=torch.int64)}).item())


@pytest.mark.parametrize("length,reason", [(2**63, "cannot fit 'int' into an index-sized integer"),
                                           (-1, "__len__() should return >= 0")])
def test_a_length_python_cant_use_is_a_domain_error(prog: Any, length: int, reason: str) -> None:
    m = prog.M.init(seed=0)
    for fn, op in ((prog.shuffled, "shuffle"), (prog.in_order, "batches")):
        with pytest.raises(DomainError, match=re.escape(f"{op}: the Huge's __len__ returned a length Python can't "
                                                        f"use ({reason})")):
            fn(m, Huge(length))


@pytest.mark.parametrize("seed,shown", [(2**64, str(2**64)), (-2**63 - 1, str(-2**63 - 1)),
                                        (10**400, "a number of 1329 bits")], ids=["2**64", "-2**63-1", "10**400"])
def test_a_seed_torch_cant_take_is_a_domain_error(prog: Any, seed: int, shown: str) -> None:
    m = prog.M.init(seed=0)
    with pytest.raises(DomainError, match=re.escape(f"shuffle: the seed must be from -2**63 to 2**64 - 1, got {shown}")):
        prog.seeded(m, Huge(4), seed)
    assert prog.seeded(m, Huge(4), 2**64 - 1).item() == pytest.approx(prog.shuffled(m, Huge(4)).item())
