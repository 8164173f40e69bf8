"""Generic models (`model Linear[I O]:`, used as `Linear[D C]`): each use a model type of its own with
its dims put in, functions generic over a use's dims (`fn linear(m: Linear[i o], x: [b i])`), checked
from Python by the dims they bind; the codes of each misuse, said where the mistake is. (The
SimpleViT-style program in tests/several/test_generic_models_several.py runs on every layout.)"""

from __future__ import annotations

import pytest
import torch

import shapescript as ss
from shapescript.errors import CompileError, ShapeError

LAYERS = """\
dim D = 4
dim E = 6
dim C = 3

model Linear[I O]:
    param w: [I O] f64 = normal(std=I ** -0.5)
    param b: [O] f64 = zeros()

model Norm[D]:
    param g: [D] f64 = ones()

model Net:
    up: Linear[D E]
    norm: Norm[E]
    head: Linear[E C]

fn linear(m: Linear[i o], x: [b i] f64) -> [b o] f64 = x @ m.w + m.b

fn scaled(m: Norm[n], x: [b n] f64) -> [b n] f64 = x * m.g

fn forward(m: Net, x: [b D] f64) -> [b C] f64 = linear(m.head, scaled(m.norm, relu(linear(m.up, x))))
"""


def errors(src: str) -> list[tuple[str, str]]:
    with pytest.raises(CompileError) as info:
        ss.load(src, name="generic.ss")
    return [(d.code, d.message) for d in info.value.diagnostics]


@pytest.fixture(scope="module")
def prog() -> ss.Program:
    return ss.load(LAYERS, name="generic.ss")


def test_each_use_has_its_own_sizes_and_one_type_per_dims(prog: ss.Program) -> None:
    models = prog.checked.models
    assert sorted(models) == ["Linear[D E]", "Linear[E C]", "Net", "Norm[E]"]
    m = prog.Net.init(seed=0)
    assert m.up.w.shape == (4, 6) and m.head.w.shape == (6, 3) and m.norm.g.shape == (6,)
    # an initializer's constant reads the use's dims: std = I ** -0.5 with I = D, then I = E
    assert models["Linear[D E]"].members["w"].init_args["std"] == pytest.approx(4 ** -0.5)
    assert models["Linear[E C]"].members["w"].init_args["std"] == pytest.approx(6 ** -0.5)
    assert torch.std(prog.Linear["E", "C"].init(seed=1).w).item() < 0.8  # drawn with its own std
    # the model's dim `D` hides the declared D inside it: Norm[E] is 6 wide
    assert prog.checked.fns["scaled"].params[0].ty.show() == "Norm[n]"


def test_the_values_are_torchs(prog: ss.Program) -> None:
    m = prog.Net.init(seed=0)
    x = torch.randn(5, 4, dtype=torch.float64)
    expected = torch.relu(x @ m.up.w + m.up.b) * m.norm.g @ m.head.w + m.head.b
    torch.testing.assert_close(prog.forward(m, x), expected, atol=1e-14, rtol=0)
    torch.testing.assert_close(prog.linear(m.up, x), x @ m.up.w + m.up.b, atol=1e-14, rtol=0)


def test_a_generic_function_checks_the_dims_a_model_binds(prog: ss.Program) -> None:
    m = prog.Net.init(seed=0)
    with pytest.raises(ShapeError, match=r"`x` of `linear`.*i was bound to 6 by `m.w`"):
        prog.linear(m.head, torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(ShapeError, match=r"`m` of `scaled`.* must be Norm\[n\], not a model of type Linear\[D E\]"):
        prog.scaled(m.up, torch.randn(2, 6, dtype=torch.float64))
    with pytest.raises(KeyError, match=r"no `Linear\[C C\]`: it uses Linear\[D E\], Linear\[E C\]"):
        prog.Linear["C", "C"]


def test_a_use_of_other_dims_is_another_type() -> None:
    found = errors(LAYERS + "\nfn wrong(m: Net, x: [b D] f64) -> [b C] f64 = linear(m.up, x) @ m.head.w"
                   "\n\nfn other(m: Linear[D C]) -> Linear[D C] = m\n\nfn call(n: Net) -> Linear[D C] = other(n.up)\n")
    assert any(code == "E0401" and "`other`'s parameter `m` is Linear[D C], but this is Linear[D E]" in msg
               for code, msg in found), found


def test_the_callees_dims_are_one_size_in_a_call() -> None:
    found = errors(LAYERS + "\nfn wrong(m: Net, x: [b E] f64) -> [b E] f64 = linear(m.up, x)\n")
    assert [code for code, _ in found] == ["E0306"], found
    assert "dim `i` of `linear` is D from `m`, but `x` gives E" in found[0][1]


@pytest.mark.parametrize("src, code, words", [
    ("model L[I O]:\n    param w: [I O] = zeros()\nmodel M:\n    l: L\n", "E0204", "`L` takes 2 dims, as `L[I O]`, but this gives 0"),
    ("dim D = 2\nmodel L[I O]:\n    param w: [I O] = zeros()\nmodel M:\n    l: L[D]\n", "E0204", "takes 2 dims"),
    ("dim D = 2\nmodel L:\n    param w: [D] = zeros()\nmodel M:\n    l: L[D]\n", "E0204", "has sizes of its own"),
    ("model L[I]:\n    param w: [I J] = zeros()\n", "E0312", "`J` isn't a declared dim"),
    ("model L[I I]:\n    param w: [I] = zeros()\n", "E0202", "dim `I` is listed twice"),
    ("model T[N]:\n    param w: [N] = zeros()\n    t: T[N]\n", "E0402", "model `T` contains itself"),
    ("model L[I]:\n    param w: [I - 2] = zeros()\nmodel M:\n    l: L[2]\n", "E0310", "in `L[2]`: the dim 0 isn't a positive whole size"),
    ("dim D = 2\nmodel L[I]:\n    param w: [I] = normal(std=nope)\nmodel M:\n    a: L[D]\n    b: L[3]\n", "E0407", "constant"),
])
def test_each_misuse_has_its_code(src: str, code: str, words: str) -> None:
    found = errors(src)
    assert [c for c, _ in found] == [code], found  # said once, however many uses
    assert words in found[0][1], found


def test_the_model_is_said_where_it_is_used_for_a_size_only_its_use_gets_wrong() -> None:
    with pytest.raises(CompileError) as info:
        ss.load("model L[I]:\n    param w: [I - 2] = zeros()\nmodel M:\n    l: L[2]\n", name="g.ss")
    d = info.value.diagnostics[0]
    assert (d.span.line, d.secondary[0][0].line) == (4, 2)  # at the use, pointing into the model


def test_stacks_of_uses_and_a_stacks_count_as_a_models_dim() -> None:
    prog = ss.load("dim E = 3\ndim L = 2\n\nmodel Block[W]:\n    param w: [W W] f64 = normal(std=0.5)\n\n"
                   "model Tower[K W]:\n    blocks: [K] Block[W]\n\nmodel Net:\n    tower: Tower[L E]\n\n"
                   "fn run(m: Tower[k w], x: [b w] f64) -> [b w] f64:\n    for block in m.blocks:\n"
                   "        x = tanh(x @ block.w)\n    return x\n\n"
                   "fn forward(m: Net, x: [b E] f64) -> [b E] f64 = run(m.tower, x)\n", name="stack.ss")
    m = prog.Net.init(seed=0)
    x = torch.randn(2, 3, dtype=torch.float64)
    assert len(m.tower.blocks) == 2
    expected = torch.tanh(torch.tanh(x @ m.tower.blocks[0].w) @ m.tower.blocks[1].w)
    torch.testing.assert_close(prog.forward(m, x), expected, atol=1e-14, rtol=0)


def test_an_optimizer_of_a_use_trains_it() -> None:
    prog = ss.load("dim D = 3\ndim C = 2\n\nmodel Linear[I O]:\n    param w: [I O] f64 = normal(std=0.5)\n\n"
                   "fn loss(m: Linear[D C], x: [b D] f64) -> [] f64 = sum((x @ m.w) * (x @ m.w))\n\n"
                   "fn step(mut m: Linear[D C], mut opt: Sgd[Linear[D C]], x: [b D] f64) -> [] f64:\n"
                   "    l, g = value_and_grad(loss, m, x)\n    update(mut m, mut opt, g)\n    return l\n", name="opt.ss")
    m = prog.Linear["D", "C"].init(seed=0)
    w = m.w.clone()
    x = torch.randn(4, 3, dtype=torch.float64)
    prog.step(m, ss.sgd(m, lr=0.1), x)
    torch.testing.assert_close(m.w, w - 0.1 * 2 * x.T @ (x @ w), atol=1e-14, rtol=0)


DTYPED = """\
dim D = 3
dim C = 2

model Linear[I O T]:
    param w: [I O] T = normal(std=0.5)

model Net:
    a: Linear[D C f64]
    b: Linear[D C f32]

fn apply(m: Linear[i o f64], x: [b i] f64) -> [b o] f64 = x @ m.w

fn forward(m: Net, x: [b D] f64) -> [b C] f64 = apply(m.a, x)
"""


def test_a_dtype_param_gives_each_use_its_dtype() -> None:
    prog = ss.load(DTYPED, name="dtyped.ss")
    assert sorted(prog.checked.models) == ["Linear[D C f32]", "Linear[D C f64]", "Net"]
    m = prog.Net.init(seed=0)
    assert (m.a.w.dtype, m.b.w.dtype) == (torch.float64, torch.float32)
    x = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(prog.forward(m, x), x @ m.a.w, atol=0, rtol=0)
    with pytest.raises(ShapeError, match=r"Linear\[D C f32\]'s `w` is f32, but Linear\[i o f64\] needs f64"):
        prog.apply(m.b, x)


@pytest.mark.parametrize("extra, code, words", [
    ("fn g(m: Net, x: [b D] f64) -> [b C] f64 = apply(m.b, x)\n", "E0401", "is Linear[i o f64], but this is Linear[D C f32]"),
    ("model Q:\n    q: Linear[D C D]\n", "E0204", "`T` of `Linear` is a dtype, not `D`"),
    ("model Q:\n    q: Linear[D C i64]\n", "E0308", "in `Linear[D C i64]`: param `w` has dtype i64"),
])
def test_a_dtype_param_misused(extra: str, code: str, words: str) -> None:
    found = errors(DTYPED + "\n" + extra)
    assert [c for c, _ in found] == [code] and words in found[0][1], found
