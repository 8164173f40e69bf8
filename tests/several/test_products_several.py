"""The guarantee with oneDNN's products (runtime/products.py): the README MLP at a batch of 768, so
that every device's rows (768, 384, 256) take oneDNN's path in its first layer, trains on `cpu[0 1]`
and `cpu[0 1 2]` as on `cpu`, and on `cpu` as the hand-written PyTorch model does, within float32
rounding. The workers read SHAPESCRIPT_MATMUL as they start: their results with oneDNN differ in
the last bits from theirs with torch's products, which shows that they did take oneDNN's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hand_mlp import HandMlp, batches
from programs import README

import shapescript as ss
from shapescript.runtime import products

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(products._LINEAR is None, reason="this torch has no oneDNN linear kernel here")]

BATCH, STEPS = 768, 4
# SGD: AdamW divides each gradient by its own size, so where one is a sum that nearly cancels, the
# last bits of the products move its step by a visible amount; SGD's steps move with the gradients.
SOURCE = README.replace("AdamW[Mlp]", "Sgd[Mlp]")
LR, MOMENTUM = 0.05, 0.9


def train(devices: str, setting: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], dict]:
    with monkeypatch.context() as env:
        env.setenv(products.ENV, setting)  # the workers'
        env.setattr(products, "ENABLED", setting == "onednn")  # this process's, for devices="cpu"
        prog = ss.load(SOURCE, devices=devices, name="mlp.ss")
        try:
            m = prog.Mlp.init(seed=0)
            opt = ss.sgd(m, lr=LR, momentum=MOMENTUM)
            losses = [float(prog.train_step(m, opt, {"img": x, "label": y})) for x, y in batches(STEPS, BATCH)]
            return losses, m.state_dict()
        finally:
            prog.stop()


def hand_written() -> tuple[list[float], dict]:
    ref = HandMlp(seed=0)
    opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for x, y in batches(STEPS, BATCH):
        loss = F.cross_entropy(ref(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach() for k, v in ref.state_dict().items()}


def compare(want: tuple[list[float], dict], got: tuple[list[float], dict]) -> None:
    """The same losses and params within 1e-6 (they differ by about 1e-8 here)."""
    assert got[0] == pytest.approx(want[0], abs=1e-6)
    assert set(got[1]) == set(want[1])
    for k in want[1]:
        torch.testing.assert_close(got[1][k], want[1][k], atol=1e-6, rtol=0, msg=k)


def test_onednn_products_train_on_several_devices_as_on_one_and_as_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    one = train("cpu", "onednn", monkeypatch)
    compare(hand_written(), one)
    assert one[0][-1] < one[0][0]
    onednn_two = train("cpu[0 1]", "onednn", monkeypatch)
    compare(one, onednn_two)
    compare(one, train("cpu[0 1 2]", "onednn", monkeypatch))
    with_torch = train("cpu[0 1]", "torch", monkeypatch)
    compare(one, with_torch)
    # the same within rounding, but not the same bits: the workers' products were oneDNN's
    assert any(not torch.equal(onednn_two[1][k], with_torch[1][k]) for k in with_torch[1])
