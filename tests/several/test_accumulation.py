"""Gradient arithmetic (issue 39 item 3) on several devices: accumulating over micro-batches
averages the gradients once, at the update (plan/accumulate.py), and gives what one device and
torch compute; a field of gradients in pieces is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from programs import ACCUMULATE

import shapescript as ss
from shapescript.errors import ShapeError

PROGRAM = ACCUMULATE


def micro_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in (6, 6)]


def by_hand(w0: torch.Tensor, b0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nanoGPT's accumulation: each micro-batch's loss / 2, backward into the same .grad, clipped,
    one SGD step: the new w and b, and the accumulated gradient of b."""
    w, b = w0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
    for x, y in micro_batches():
        (F.cross_entropy(x @ w + b, y) / 2).backward()
    grad_b = b.grad.clone()
    torch.nn.utils.clip_grad_norm_([w, b], 0.5)
    with torch.no_grad():
        return w - 0.1 * w.grad, b - 0.1 * b.grad, grad_b


@pytest.mark.slow
def test_accumulated_gradients_are_one_devices_and_torchs_on_every_device_count() -> None:
    for devices in ("cpu", "cpu[0 1]", "cpu[0 1 2]"):
        prog = ss.load(PROGRAM, devices=devices, name="acc.ss")
        try:
            m = prog.Lin.init(seed=0)
            w0, b0 = m.w.detach().clone(), m.b.detach().clone()
            opt = ss.sgd(m, lr=0.1)
            (x1, y1), (x2, y2) = micro_batches()
            grad_b = prog.accumulate(m, opt, ss.Batch(prog.Ex, {"x": x1, "y": y1}),
                                     ss.Batch(prog.Ex, {"x": x2, "y": y2}), torch.tensor(3.0))
            w, b, want_b = by_hand(w0, b0)
            torch.testing.assert_close(grad_b, want_b, atol=1e-7, rtol=1e-6, msg=devices)
            torch.testing.assert_close(m.w, w, atol=1e-7, rtol=1e-6, msg=devices)
            torch.testing.assert_close(m.b, b, atol=1e-7, rtol=1e-6, msg=devices)
            # ema: an exponential moving average of the params, in a second model of the same type
            avg = prog.Lin.init(seed=1)
            a0 = avg.w.detach().clone()
            prog.average(avg, m, torch.tensor(0.75))
            torch.testing.assert_close(avg.w, 0.75 * a0 + 0.25 * w, atol=1e-7, rtol=1e-6, msg=devices)
            torch.testing.assert_close(m.w, w, atol=1e-7, rtol=1e-6, msg=devices)  # the model stays
        finally:
            prog.stop()


@pytest.mark.slow
def test_a_field_of_gradients_in_pieces_is_refused_where_it_runs() -> None:
    prog = ss.load("devices cpu[0 1]\n    shard params\n\n" + PROGRAM, name="acc.ss")
    try:
        m = prog.Lin.init(seed=0)
        (x1, y1), (x2, y2) = micro_batches()
        with pytest.raises(ShapeError, match="in pieces on the workers"):
            prog.accumulate(m, ss.sgd(m), ss.Batch(prog.Ex, {"x": x1, "y": y1}),
                            ss.Batch(prog.Ex, {"x": x2, "y": y2}), torch.tensor(1.0))
    finally:
        prog.stop()
