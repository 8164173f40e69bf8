"""take, window, cat, stack and pad (ops/selecting.py), each against PyTorch written by hand in f64
(values and gradients, exactly); a position out of range when the program runs; the codes of their
misuses; and what each does across the batch axis and under the layout options, as the checker and
the DeviceTable say before anything runs. (tests/several/test_selecting_several.py runs them on
several devices.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_more_ops import DIMS, against_torch, labels, r, sent

import shapescript as ss
from shapescript.errors import CompileError
from shapescript.pipeline import compile_program

# (name, the function f, its inputs, the same in PyTorch); DIMS: C = 4, D = 3, V = 5.
CASES = [
    ("take-last", "fn f(x: [b n D] f64) -> [b D] f64 = take(x, -1, over=n)", (r(2, 6, 3),), lambda x: x[:, -1]),
    ("take-first-axis", "fn f(x: [C D] f64) -> [D] f64 = take(x, 2, over=C)", (r(4, 3),), lambda x: x[2]),
    ("take-computed", "fn f(x: [b n D] f64) -> [b n] f64 = take(x, D - 2, over=D)", (r(2, 5, 3),),
     lambda x: x[:, :, 1]),
    ("take-index", "fn f(x: [b C D] f64, i: [] Index[C]) -> [b D] f64 = take(x, i, over=C)",
     (r(2, 4, 3), torch.tensor(3)), lambda x, i: x[:, int(i)]),
    ("take-of-ids", "fn f(ids: [b n] Index[V]) -> [b] Index[V] = take(ids, 0, over=n)", (labels(5, 3, 4),),
     lambda ids: ids[:, 0]),
    ("window", "fn f(x: [b n D] f64) -> [b 2 D] f64 = window(x, 1, 2, over=n)", (r(2, 5, 3),), lambda x: x[:, 1:3]),
    ("window-last", "fn f(x: [b n D] f64) -> [b C D] f64 = window(x, -C, C, over=n)", (r(2, 7, 3),),
     lambda x: x[:, -4:]),
    ("window-dims", "fn f(x: [b n D] f64, y: [m] i64) -> [b n m] f64 = window(x * 1.0, D - m, m, over=D)",
     (r(2, 5, 3), labels(5, 2)), lambda x, y: x[:, :, 1:3]),
    ("cat", "fn f(x: [b n D] f64, y: [b 1 D] f64) -> [b n+1 D] f64 = cat(x, y, over=n)", (r(2, 5, 3), r(2, 1, 3)),
     lambda x, y: torch.cat((x, y), 1)),
    ("cat-three", "fn f(x: [b D] f64, y: [b C] f64) -> [b 2*D+C] f64 = cat(x, y, x, over=D)",
     (r(2, 3), r(2, 4)), lambda x, y: torch.cat((x, y, x), 1)),
    ("cat-ids", "fn f(ids: [b n] Index[V], t: [b 1] Index[V]) -> [b n+1] Index[V] = cat(ids, t, over=n)",
     (labels(5, 2, 4), labels(5, 2, 1)), lambda ids, t: torch.cat((ids, t), 1)),
    ("stack", "fn f(x: [b D] f64, y: [b D] f64) -> [2 b D] f64 = stack(x, y)", (r(2, 3), r(2, 3)),
     lambda x, y: torch.stack((x, y))),
    ("stack-three", "fn f(x: [D] f64, y: [D] f64) -> [3 D] f64 = stack(x, y * 2.0, x)", (r(3), r(3)),
     lambda x, y: torch.stack((x, y * 2.0, x))),
    ("pad", "fn f(x: [b n D] f64) -> [b n+3 D] f64 = pad(x, 1, 2, over=n, value=0.5)", (r(2, 4, 3),),
     lambda x: F.pad(x, (0, 0, 1, 2), value=0.5)),
    ("pad-last-axis", "fn f(x: [b D] f64) -> [b D+C] f64 = pad(x, 0, C, over=D)", (r(2, 3),),
     lambda x: F.pad(x, (0, 4))),
    ("pad-by-a-generic-dim", "fn f(x: [b n] f64, y: [k] i64) -> [k+b n] f64 = pad(x, k, 0, over=b, value=-1.0)",
     (r(2, 4), labels(5, 3)), lambda x, y: F.pad(x, (0, 0, 3, 0), value=-1.0)),
    ("pad-ids", "fn f(ids: [b n] Index[V]) -> [b n+1] Index[V] = pad(ids, 1, 0, over=n)", (labels(5, 2, 4),),
     lambda ids: F.pad(ids, (1, 0))),
    ("pad-int", "fn f(ids: [b n] i64) -> [b n+1] i64 = pad(ids, 0, 1, over=n, value=-1)", (labels(5, 2, 4),),
     lambda ids: F.pad(ids, (0, 1), value=-1)),
    ("generation", "fn crop(ids: [b m] Index[V]) -> [b C] Index[V] = window(ids, -C, C, over=m)\n"
     "fn f(logits: [b n V] f64, ids: [b n] Index[V]) -> [b C] Index[V] = "
     "crop(cat(ids, window(argmax(logits, over=V), -1, 1, over=n), over=n))",
     (r(2, 6, 5), labels(5, 2, 6)), lambda logits, ids: torch.cat((ids, logits.argmax(2)[:, -1:]), 1)[:, -4:]),
]


@pytest.mark.parametrize("name, src, inputs, reference", CASES, ids=[c[0] for c in CASES])
def test_each_op_is_torchs_to_the_bit(name: str, src: str, inputs, reference) -> None:
    against_torch(src, inputs, reference, exact=True)


RANGE = DIMS + """fn at(x: [b n] f64, i: int) -> [b] f64 = take(x, i, over=n)
fn part(x: [b n] f64, start: int) -> [b C] f64 = window(x, start, C, over=n)
fn tail(x: [b n] f64, y: [k] f64) -> [b k] f64 = window(x, -k, k, over=n)
"""


@pytest.mark.parametrize("call, message", [
    ("at(x, 6)", "`take` at position 6 along n, which has 6: a position is in 0..5, or -6..-1 from the end"),
    ("at(x, -7)", "`take` at position -7 along n, which has 6"),
    ("part(x, 3)", "`window` takes C = 4 entries along n from 3, which has 6"),
    ("part(x, -3)", "`window` takes C = 4 entries along n from -3, which has 6"),
    ("tail(x, r(7))", "`window` takes k = 7 entries along n from -7, which has 6"),
])
def test_a_position_known_only_when_it_runs_is_checked_then(call: str, message: str) -> None:
    """Out of range is a ShapeError naming the call's .ss place, never torch's IndexError."""
    prog = ss.load(RANGE, name="range.ss")
    x = r(2, 6)
    with pytest.raises(ss.ShapeError) as info:
        eval(call, {"at": prog.at, "part": prog.part, "tail": prog.tail, "x": x, "r": r})
    assert "range.ss:" in str(info.value) and message in str(info.value)
    assert torch.equal(prog.at(x, -6), x[:, 0]) and torch.equal(prog.part(x, -4), x[:, 2:])


MISUSES = [
    ("fn f(x: [b C]) -> [b] = take(x, 4, over=C)", "E0309", "`take` at position 4 along C, which has 4"),
    ("fn f(x: [b C]) -> [b] = take(x, -5, over=C)", "E0309", "position -5"),
    ("fn f(x: [b C], i: [] Index[V]) -> [b] = take(x, i, over=C)", "E0309", "not [] Index[V]"),
    ("fn f(x: [b C], i: [b] Index[C]) -> [b] = take(x, i, over=C)", "E0309", "not [b] Index[C]"),
    ("fn f(x: [b C]) -> [b] = take(x, 1.0, over=C)", "E0401", "Index[C]`, not float"),
    ("fn f(x: [b C]) -> [b] = take(x, 1, over=D)", "E0303", "has no axis D"),
    ("fn f(x: [b C]) -> [b] = take(x, 1)", "E0206", "missing `over`"),
    ("fn f(x: [] f64) -> [] f64 = take(x, 0, over=C)", "E0302", "has none"),
    ("fn f(x: [b C]) -> [b 5] = window(x, 0, 5, over=C)", "E0310", "5 entries along C, which has 4"),
    ("fn f(x: [b C]) -> [b 2] = window(x, 3, 2, over=C)", "E0310", "2 entries along C from 3, which has 4"),
    ("fn f(x: [b C]) -> [b 2] = window(x, -1, 2, over=C)", "E0310", "from -1"),
    ("fn f(x: [b C]) -> [b 2] = window(x, 0, 0, over=C)", "E0310", "a dim or a positive whole number"),
    ("fn f(x: [b C]) -> [] = sum(window(x, 0, k, over=C))", "E0303", "`k` isn't a dim here"),
    ("fn f(x: [b C], i: [] Index[C]) -> [b 2] = window(x, i, 2, over=C)", "E0401", "start is a whole number, not"),
    ("fn f(x: [b C], y: [b D]) -> [b C+D] = cat(x, y, over=b)", "E0301", "one shape but along b"),
    ("fn f(x: [b C], y: [b C] f64) -> [b+b C] = cat(x, y, over=b)", "E0308", "`cat` of f32 and f64"),
    ("fn f(x: [b C], y: [b C D]) -> [b C] = cat(x, y, over=C)", "E0301", "[b C] and [b C D]"),
    ("fn f(x: [b C]) -> [b C] = cat(x, over=C)", "E0206", "two tensors or more, and is given 1"),
    ("fn f(x: [b C]) -> [b C+C] = cat(x, x)", "E0206", "missing `over`"),
    ("fn f(x: [b C]) -> [b C+C] = cat(x, 2.0, over=C)", "E0401", "takes a tensor"),
    ("fn f(x: [b C], y: [C b]) -> [2 b C] = stack(x, y)", "E0301", "[b C] and [C b]"),
    ("fn f(x: [b C], y: [b C] i64) -> [2 b C] = stack(x, y)", "E0308", "`stack` of f32 and i64"),
    ("fn f(x: [b C]) -> [1 b C] = stack(x)", "E0206", "given 1"),
    ("fn f(x: [b C]) -> [2 b C] = stack(x, x, over=C)", "E0206", "no parameter `over`"),
    ("fn f(x: [b C]) -> [b C+2] = pad(x, -1, 3, over=C)", "E0310", "not -1"),
    ("fn f(x: [b C]) -> [b C+2] = pad(x, 1, 1, over=C, value=x)", "E0401", "`pad`'s value is a number"),
    ("fn f(x: [b C] bool) -> [b C+2] bool = pad(x, 1, 1, over=C)", "E0308", "`pad` of bool"),
    ("fn f(x: [b C] i64) -> [b C+2] i64 = pad(x, 1, 1, over=C, value=0.5)", "E0308", "with a float"),
    ("fn f(x: [b C]) -> [b C+2] = pad(x, 1, over=C)", "E0206", "missing `after`"),
    ("fn f(x: [b C]) -> [b C] = pad(x, 1, 1, over=C)", "E0305", ""),
    ("fn f(x: [b n]) -> [b n] = cat(x, x, over=n)", "E0305", "[b 2*n]"),
]


@pytest.mark.parametrize("src, code, message", MISUSES, ids=[f"{m[1]}-{k}" for k, m in enumerate(MISUSES)])
def test_a_misuse_is_a_compile_error(src: str, code: str, message: str) -> None:
    with pytest.raises(CompileError) as info:
        ss.load(DIMS + src + "\n", name="bad.ss")
    assert set(info.value.codes) == {code} and message in str(info.value), str(info.value)


BATCH = """dim T = 4
dim D = 3
dim H = 2

data Ex:
    x: [T D] f64
    y: [D] f64
    ids: [T] Index[D]

"""


@pytest.mark.parametrize("body", [
    "take(batch.y, 0, over=b)", "take(batch.y, -1, over=b)", "window(batch.x, 0, 2, over=b)",
    "window(batch.x, 0, b, over=T)", "cat(batch.y, batch.y, over=b)", "pad(batch.x, 1, 0, over=b)",
    "pad(batch.x, 0, b, over=T)",
])
def test_along_the_batch_axis_each_is_refused_on_several_devices(body: str) -> None:
    """Each device holds a part of the batch: its last example is not the batch's last. One E1801,
    even where the result's size (b+1) would be no batch axis either."""
    source = BATCH + f"fn f(batch: [b] Ex) -> [] f64 = sum({body})\n"
    with pytest.raises(CompileError) as info:
        compile_program(source, "t.ss", "cpu[0 1]")
    assert info.value.codes == ["E1801"] and "across the batch axis" in str(info.value), str(info.value)
    compile_program(source, "t.ss", "cpu")  # one device: the whole batch


def test_along_other_axes_each_works_per_example_and_sends_nothing() -> None:
    source = BATCH + """fn f(batch: [b] Ex) -> [b 2*T+6 D] f64:
    last = take(batch.x, -1, over=T) + take(batch.x, T - 1, over=T)
    both = rearrange(stack(last, batch.y, last), k b d -> b k d)
    return cat(pad(batch.x, 1, 0, over=T), window(batch.x, 1, 2, over=T), both, batch.x, over=T)
"""
    assert sent(source) == []
    assert compile_program(source, "t.ss", "cpu[0 1]").placement("f").where == "workers"


LAYOUT = """dim D = 3
dim H = 4
dim T = 5

data Ex:
    x: [T D] f64

model Net:
    param w: [D H] f64 = normal(std=0.5)

fn along_t(m: Net, batch: [b] Ex) -> [b 2*T+3 H] f64:
    h = batch.x @ m.w
    return cat(pad(h, 1, 0, over=T), window(h, 1, 2, over=T), h, over=T) + 0.0
fn picked(m: Net, batch: [b] Ex) -> [b H] f64 = take(batch.x @ m.w, -1, over=T)
fn along_h(m: Net, batch: [b] Ex) -> [b T 2] f64 = window(batch.x @ m.w, 0, 2, over=H)
"""


def test_under_split_h_each_works_on_its_heads_along_other_axes_and_gathers_along_h() -> None:
    """Along T every device keeps its part of H and sends nothing; a window along H needs H whole."""
    table = sent("devices cpu[0 1]\n    split H\n\n" + LAYOUT, None)
    assert [(line, op) for line, _, op, _ in table] == [(18, "all-gather")]


def test_under_shard_params_they_send_nothing_of_their_own() -> None:
    table = sent("devices cpu[0 1]\n    shard params\n\n" + LAYOUT, None)
    assert {op for *_, op, _ in table} == {"all-gather"}  # the param's pieces, nothing more
