"""The README's MLP, compiled by ShapeScript, against the same model written by hand in PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hand_mlp import HandMlp, batches
from programs import README, README_FILE

import shapescript as ss


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_ten_steps_match_hand_written_pytorch(optimizer: str) -> None:
    source = README
    if optimizer == "sgd":
        source = source.replace("AdamW[Mlp]", "Sgd[Mlp]")
    prog = ss.load(source, devices="cpu", name="mlp.ss")
    m = prog.Mlp.init(seed=0)
    ref = HandMlp(seed=0)
    assert torch.equal(m.w1, ref.w1) and torch.equal(m.w2, ref.w2)
    if optimizer == "adamw":
        opt = ss.adamw(m, lr=1e-3)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    else:
        opt = ss.sgd(m, lr=0.05, momentum=0.9)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    losses, ref_losses = [], []
    for x, y in batches(10):
        losses.append(float(prog.train_step(m, opt, {"img": x, "label": y})))
        ref_loss = F.cross_entropy(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(float(ref_loss.detach()))
    assert losses == pytest.approx(ref_losses, abs=1e-6)
    assert losses[-1] < losses[0]
    torch.testing.assert_close(m.w1, ref.w1.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(m.w2, ref.w2.detach(), atol=1e-6, rtol=0)


def test_forward_and_loss_match_and_leave_no_graph() -> None:
    prog = ss.load(README_FILE, devices="cpu")
    m = prog.Mlp.init(seed=3)
    ref = HandMlp(seed=3)
    x, y = batches(1, size=17)[0]
    out = prog.forward(m, x)
    assert out.shape == (17, 10) and not out.requires_grad
    torch.testing.assert_close(out, ref(x).detach(), atol=1e-6, rtol=0)
    loss = prog.loss(m, {"img": x, "label": y})
    torch.testing.assert_close(loss, F.cross_entropy(ref(x), y).detach(), atol=1e-6, rtol=0)


def test_run_loops_over_a_dataset_and_logs_each_step() -> None:
    prog = ss.load(README_FILE, devices="cpu")
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    g = torch.Generator().manual_seed(5)
    data = ss.TensorDataset(img=torch.randn(200, 784, generator=g), label=torch.randint(0, 10, (200,), generator=g))
    sink = ss.sinks.memory()
    prog.run(m, opt, data, sink)
    assert len(sink.records) == 4  # 64 + 64 + 64 + 8
    # The same loop by hand: the same shuffle, the same batches, the same losses.
    ref = HandMlp(seed=0)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    order = torch.randperm(200, generator=torch.Generator().manual_seed(0))
    for k, start in enumerate(range(0, 200, 64)):
        idx = order[start:start + 64]
        loss = F.cross_entropy(ref(data.fields["img"][idx]), data.fields["label"][idx])
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert sink.records[k]["loss"] == pytest.approx(float(loss), abs=1e-6)
