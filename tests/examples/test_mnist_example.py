"""examples/mnist: net.ss equals pytorch/examples' MNIST `Net` written by hand in PyTorch
(reference.py) in f64 from the same weights: its log-probabilities, its nll_loss, and 5 Adadelta
steps (the example's optimizer, lr 1.0), within 1e-10, on cpu, cpu[0 1] and cpu[0 1] with
`shard params` (dropout off on both sides: Eval, and the reference in eval())."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F
from support import ROOT

import shapescript as ss

HERE = ROOT / "examples" / "mnist"
TOLERANCE = 1e-10
STEPS = 5


def reference():
    spec = importlib.util.spec_from_file_location("mnist_reference", HERE / "reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def images(step: int, n: int = 4) -> dict[str, torch.Tensor]:
    """MNIST-like inputs: pixels in 0..1, normalized as the example does, and labels."""
    g = torch.Generator().manual_seed(step)
    pixels = torch.rand(n, 1, 28, 28, generator=g, dtype=torch.float64)
    return {"img": (pixels - reference().MEAN) / reference().STD, "label": torch.randint(0, 10, (n,), generator=g)}


@pytest.fixture(scope="module")
def torch_run() -> tuple[dict[str, torch.Tensor], torch.Tensor, list[float], dict[str, torch.Tensor]]:
    """The init (net.ss's, seed 0), the reference's log-probabilities of the first batch, and its losses
    and params over the steps."""
    start = ss.load(HERE / "net.ss").Net.init(seed=0).state_dict()
    net = reference().Net().double()
    net.load_shapescript(start)
    net.eval()
    first = net(images(0)["img"]).detach()
    opt = torch.optim.Adadelta(net.parameters(), lr=1.0)
    losses = []
    for step in range(STEPS):
        batch = images(step)
        opt.zero_grad()
        loss = F.nll_loss(net(batch["img"]), batch["label"])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return start, first, losses, {name: p.detach().clone() for name, p in net.named_parameters()}


@pytest.mark.parametrize("devices", ["cpu", "cpu[0 1]", "cpu[0 1] shard params"])
def test_net_equals_pytorch_examples_net_and_its_adadelta_steps(torch_run, devices: str) -> None:
    start, first, losses, params = torch_run
    source = (HERE / "net.ss").read_text()
    if "shard" in devices:
        source = "devices cpu[0 1]\n    shard params\n\n" + source
    prog = ss.load(source, devices=devices.split(" shard")[0], name="net.ss")
    try:
        m = prog.Net.init(seed=0)
        assert all(torch.equal(v, start[k]) for k, v in m.state_dict().items())
        torch.testing.assert_close(prog.forward(m, images(0)["img"], ss.Eval), first, atol=TOLERANCE, rtol=0)
        opt = ss.adadelta(m, lr=1.0)
        got = [float(prog.train_step(m, opt, images(step), ss.Eval)) for step in range(STEPS)]
        assert got == pytest.approx(losses, abs=TOLERANCE, rel=0)
        assert len(set(losses)) == STEPS  # a real comparison: each step moves the net
        for name, value in m.state_dict().items():
            target, transpose = reference().torch_name(name)
            want = params[target].T if transpose else params[target]
            torch.testing.assert_close(value, want, atol=TOLERANCE, rtol=0, msg=name)
            assert not torch.equal(value, start[name]), name
    finally:
        prog.stop()


def test_the_training_script_learns_the_digits_scaled_to_28_by_28(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/mnist/train.py as mnist/main.py trains (Adadelta, the lr times 0.7 each epoch), on 256
    of scikit-learn's digits: far above chance (10%) after two epochs."""
    spec = importlib.util.spec_from_file_location("mnist_train", HERE / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    accuracies = module.main(["--epochs", "2", "--limit", "256"])
    assert len(accuracies) == 2 and accuracies[-1] > 0.4, accuracies
    out = capsys.readouterr().out
    assert "next lr 0.7" in out and "next lr 0.49" in out, out
