"""Stale models in a notebook: a cell that changes a dim a model type depends on
says which variables hold models made before it, and a function called with one raises a
ShapeError naming the dim, its sizes then and now, and the variable, instead of returning shapes
its type denies. Models whose type kept its shapes keep working. Through a Session without a
kernel, on cpu and on cpu[0 1] (where the model lives on the workers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from test_session import Notebook, opened

import shapescript as ss
from shapescript.errors import ShapeError

PROGRAM = ("dim D = 4\n"
           "dim Hd = 3\n"
           "\n"
           "model Mlp:\n"
           "    param w1: [D Hd] = normal(std=0.5)\n"
           "\n"
           "model Scale:\n"
           "    param s: [D] = normal(std=0.5)\n"
           "\n"
           "fn hidden(m: Mlp, x: [b D]) -> [b Hd]:\n"
           "    return x @ m.w1\n"
           "\n"
           "fn scaled(k: Scale, x: [b D]) -> [b D]:\n"
           "    return x * k.s\n"
           "\n"
           "fn energy(m: Mlp, x: [b D]) -> []:\n"
           "    return mean(hidden(m, x) * hidden(m, x))\n"
           "\n"
           "fn step(mut m: Mlp, mut opt: Sgd[Mlp], x: [b D]) -> []:\n"
           "    l, g = value_and_grad(energy, m, x)\n"
           "    update(mut m, mut opt, g)\n"
           "    return l\n")
X = torch.arange(8.0).reshape(2, 4) / 8


@pytest.fixture(params=["cpu", "cpu[0 1]"])
def nb(request: pytest.FixtureRequest) -> Iterator[Notebook]:
    with opened(f"devices {request.param}\n" + PROGRAM) as notebook:
        yield notebook


def test_a_dim_change_names_the_models_it_made_stale_and_refuses_them(nb: Notebook) -> None:
    ns = nb.ns
    ns["m"], ns["k"] = ns["Mlp"].init(seed=0), ns["Scale"].init(seed=1)
    ns["opt"] = ss.sgd(ns["m"], lr=0.1)
    w1 = ns["m"].w1
    assert torch.allclose(ns["hidden"](ns["m"], X), X @ w1)  # the model works before the change

    notes = nb.cell("dim Hd = 8\n")

    stale = [n for n in notes if "Mlp" in n]
    assert len(stale) == 1, notes  # one note for the model, none for Scale, whose shapes stayed
    for fact in ("`m`", "Hd = 3", "Hd is now 8", "`opt`", "Mlp.init(seed=0)"):
        assert fact in stale[0], (fact, stale[0])
    assert not any("Scale" in n for n in notes)
    assert not any("Mlp" in n for n in nb.cell("fn twice(x: [3]) -> [3] = x * 2.0\n"))  # said once, not at every cell

    # Called with it, a function refuses it rather than return [2 3] as a `[b Hd]` with Hd = 8.
    with pytest.raises(ShapeError) as refused:
        ns["hidden"](ns["m"], X)
    for fact in ("`m` of `hidden`", "(in `m`)", "Hd = 3", "Hd is now 8"):
        assert fact in str(refused.value), (fact, str(refused.value))
    with pytest.raises(ShapeError, match=r"Hd = 3, but Hd is now 8"):
        ns["step"](ns["m"], ns["opt"], X)
    # An optimizer of the stale model is refused too, though the model passed beside it is new.
    fresh = ns["Mlp"].init(seed=0)
    with pytest.raises(ShapeError, match=r"`opt` of `step`.*the Mlp of the optimizer passed \(in `opt`\).*Hd = 3"):
        ns["step"](fresh, ns["opt"], X)
    assert torch.equal(ns["m"].state_dict()["w1"], w1)  # the refusal changed nothing
    with pytest.raises(ShapeError, match=r"reading `w1`: this Mlp was made with Hd = 3, but Hd is now 8"):
        ns["m"].w1  # noqa: B018  (a read is refused as the calls are)

    # The model whose type didn't change keeps working, checked against torch on its own values.
    assert torch.allclose(ns["scaled"](ns["k"], X), X * ns["k"].s)
    # A model made again works at the new size.
    ns["m"] = ns["Mlp"].init(seed=0)
    assert ns["m"].w1.shape == (4, 8)
    assert torch.allclose(ns["hidden"](ns["m"], X), X @ ns["m"].w1)


def test_a_changed_model_block_refuses_its_old_models_but_not_a_changed_init(nb: Notebook) -> None:
    ns = nb.ns
    ns["m"] = ns["Mlp"].init(seed=0)
    # Only the init changed: the shapes are the same, so the model fits the new program.
    notes = nb.cell("model Mlp:\n    param w1: [D Hd] = normal(std=0.1)\n")
    assert notes == ["model Mlp changed: m was made from its old definition; make new models with Mlp.init(seed=...)."]
    assert torch.allclose(ns["hidden"](ns["m"], X), X @ ns["m"].w1)

    nb.cell("model Mlp:\n    param w1: [D Hd] = normal(std=0.1)\n    param b1: [Hd] = zeros()\n")
    with pytest.raises(ShapeError, match=r"older definition of Mlp \(b1 was not there, is param \[3\] f32 now\)"):
        ns["hidden"](ns["m"], X)


def test_a_stack_count_and_a_dim_in_arithmetic_are_named_in_the_program_terms() -> None:
    """On one device: a stack's count is its dim; an axis of arithmetic (`[2*D]`) names its member;
    back at the sizes it was made with, a model fits again."""
    nb = Notebook()
    nb.cell("dim D = 2\ndim L = 2\n\nmodel Block:\n    param w: [D D] = normal(std=0.5)\n"
            "    param wide: [2*D] = zeros()\n\nmodel Tower:\n    blocks: [L] Block\n\n"
            "fn through(t: Tower, x: [b D]) -> [b D]:\n    for block in t.blocks:\n        x = x @ block.w\n    return x\n")
    nb.ns["t"] = nb.ns["Tower"].init(seed=0)
    notes = nb.cell("dim L = 3\n")
    assert len(notes) == 1 and "`t`" in notes[0] and "L = 2, but L is now 3" in notes[0], notes
    nb.cell("dim L = 2\n")  # back to the sizes it was made with: it fits again
    x = torch.ones(1, 2)
    weights = nb.ns["t"].state_dict()
    assert torch.allclose(nb.ns["through"](nb.ns["t"], x), x @ weights["blocks.0.w"] @ weights["blocks.1.w"])

    nb.cell("dim D = 3\n")
    with pytest.raises(ShapeError) as refused:
        nb.ns["through"](nb.ns["t"], torch.ones(1, 3))
    message = str(refused.value)
    assert "D = 2, but D is now 3" in message and "blocks.wide was param [4] f32, is param [6] f32 now" in message
