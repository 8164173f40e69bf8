"""Variable-length data: items with a generic dim are padded per batch, and the program knows where."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

import shapescript as ss
from shapescript.errors import CompileError

PROGRAM = textwrap.dedent("""\
    dim V = 6
    dim D = 3

    data Seq:
        tokens: [n] Index[V]
        targets: [n] Index[V]

    model M:
        param emb: [V D] = normal(std=0.5)
        param out: [D V] = normal(std=0.5)

    fn scores(m: M, batch: [b] Seq) -> [b n V] = embedding(m.emb, batch.tokens) @ m.out

    fn loss(m: M, batch: [b] Seq) -> [] = cross_entropy(scores(m, batch), batch.targets, over=V, mask=valid(batch, n))

    fn lengths(batch: [b] Seq) -> [b] = sum(where(valid(batch, n), 1.0, 0.0), over=n)

    fn avg(m: M, batch: [b] Seq) -> [b D] = mean(embedding(m.emb, batch.tokens), over=n, mask=valid(batch, n))

    fn each(m: M, data: Dataset[Seq], log: Sink):
        for batch in data |> batches(3):
            write(log, logs(loss=loss(m, batch), lengths=lengths(batch), avg=avg(m, batch)))
    """)

ITEMS = [[1, 2, 3], [4, 5], [1], [2, 3, 4, 5, 1], [0, 0]]


class Ragged:
    def __len__(self) -> int:
        return len(ITEMS)

    def __getitem__(self, i: int) -> dict:
        return {"tokens": ITEMS[i], "targets": ITEMS[i][1:] + [0]}


def test_padding_counts_only_real_positions() -> None:
    prog = ss.load(PROGRAM, name="pad.ss")
    m = prog.M.init(seed=0)
    sink = ss.sinks.memory()
    prog.each(m, Ragged(), sink)
    assert [r["lengths"] for r in sink.records] == [[3.0, 2.0, 1.0], [5.0, 2.0]]
    for record, chunk in zip(sink.records, [[0, 1, 2], [3, 4]]):
        losses, avgs = [], []
        for i in chunk:
            t, y = torch.tensor(ITEMS[i]), torch.tensor(ITEMS[i][1:] + [0])
            losses.append(F.cross_entropy(m.emb[t] @ m.out, y, reduction="none"))
            avgs.append(m.emb[t].mean(0))
        assert record["loss"] == pytest.approx(torch.cat(losses).mean().item(), abs=1e-6)
        torch.testing.assert_close(torch.tensor(record["avg"]), torch.stack(avgs).detach())


def test_two_batches_of_one_function_share_its_padded_dim() -> None:
    src = PROGRAM + "\nfn both(a: [b] Seq, c: [b] Seq) -> [b n V] = one_hot(a.tokens) + one_hot(c.tokens)\n"
    prog = ss.load(src, name="two.ss")

    def batch(n: int) -> dict:
        return {"tokens": torch.zeros(2, n, dtype=torch.int64), "targets": torch.zeros(2, n, dtype=torch.int64)}

    assert prog.both(batch(3), batch(3)).shape == (2, 3, 6)
    with pytest.raises(ss.ShapeError, match=r"n is 4 in this batch \(dim 1 of field `tokens`\), but 3 before; b was bound to 2 by `a`; n was bound to 3 by `a`"):
        prog.both(batch(3), batch(4))
    with pytest.raises(CompileError) as info:  # two loops' batches are two lengths
        ss.load(src + "fn f(m: M, d: Dataset[Seq]) -> [] = g(d, d)\n"
                "fn g(d: Dataset[Seq], e: Dataset[Seq]) -> []:\n    t = 0.0\n"
                "    for x in d |> batches(2):\n        for y in e |> batches(2):\n"
                "            t = t + sum(both(x, y))\n    return t\n", name="loops.ss")
    assert "E0306" in info.value.codes


def test_a_batch_from_python_is_taken_as_unpadded() -> None:
    prog = ss.load(PROGRAM, name="pad.ss")
    out = prog.lengths({"tokens": torch.zeros(2, 4, dtype=torch.int64),
                        "targets": torch.zeros(2, 4, dtype=torch.int64)})
    assert out.tolist() == [4.0, 4.0]
