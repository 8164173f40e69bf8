"""The attention example: the same as hand-written PyTorch, it trains well below the unigram
entropy of its text, and the same seed gives the same loss curve."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from support import ROOT

import shapescript as ss

HERE = ROOT / "examples" / "attention"
DIMS = {"V": 11, "D": 16, "H": 2, "Dh": 8, "F": 32, "L": 2}


def load_module(name: str):
    spec = importlib.util.spec_from_file_location(f"attention_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_same_losses_and_params_as_hand_written_pytorch_in_eval() -> None:
    reference = load_module("reference")
    prog = ss.load(HERE / "gpt.ss", dims=DIMS)
    m = prog.Gpt.init(seed=0)
    hand = reference.HandGpt(V=11, T=64, D=16, H=2, Dh=8, F_=32, L=2, seed=0)
    assert torch.equal(m.emb, hand.emb) and torch.equal(m.blocks[1].attn.w_o, hand.blocks[1].w_o)
    assert torch.equal(m.head, hand.head)
    opt = ss.adamw(m, lr=1e-2)
    hand_opt = torch.optim.AdamW(hand.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        tokens, targets = torch.randint(0, 11, (3, 64), generator=g), torch.randint(0, 11, (3, 64), generator=g)
        loss = prog.train_step(m, opt, {"tokens": tokens, "targets": targets}, ss.Eval)
        ref = hand.loss(tokens, targets)
        ref.backward()
        torch.nn.utils.clip_grad_norm_(hand.parameters(), 1.0)
        hand_opt.step()
        hand_opt.zero_grad()
        assert float(loss) == pytest.approx(ref.item(), abs=1e-5)
    torch.testing.assert_close(m.blocks[0].mlp.w1, hand.blocks[0].w1.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(m.head, hand.head.detach(), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_the_demo_trains_well_below_the_unigram_entropy() -> None:
    train = load_module("train")
    result = train.main(steps=120, quiet=True)
    assert result["start"] > result["unigram"]  # an untrained model knows less than character counts
    assert result["end"] < result["unigram"] - 0.4, result


def test_same_seed_same_loss_curve() -> None:
    train = load_module("train")
    a = train.main(steps=6, quiet=True)
    b = train.main(steps=6, quiet=True)
    assert a == b
