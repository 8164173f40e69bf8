"""examples/rnn: the GRU and the LSTM written once as a loop over the time axis (range, take, put)
equal torch.nn.GRU and torch.nn.LSTM in f64 from the same weights: every step's output, and the
gradients of a loss of them with respect to every weight, within 1e-10; on cpu, cpu[0 1] and
cpu[0 1 2] (an uneven split of 7 sequences), each device running its own sequences."""

from __future__ import annotations

import pytest
import torch
from support import ROOT

import shapescript as ss

HERE = ROOT / "examples" / "rnn"
T, D, HD, N = 6, 3, 4, 7
TOLERANCE = 1e-10


def sequences(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(N, T, D, generator=g, dtype=torch.float64),
            "h0": torch.randn(N, HD, generator=g, dtype=torch.float64),
            "c0": torch.randn(N, HD, generator=g, dtype=torch.float64)}


def torch_rnn(kind: str, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """torch's GRU or LSTM holding net.ss's weights: ours are [in (gates Hd)], torch's [(gates Hd) in]."""
    rnn = (torch.nn.GRU if kind == "gru" else torch.nn.LSTM)(D, HD, batch_first=True).double()
    with torch.no_grad():
        rnn.weight_ih_l0.copy_(state["wi"].T)
        rnn.weight_hh_l0.copy_(state["wh"].T)
        rnn.bias_ih_l0.copy_(state["bi"])
        rnn.bias_hh_l0.copy_(state["bh"])
    return rnn


def by_torch(kind: str, state: dict[str, torch.Tensor], data: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """torch's outputs, and the gradients of mean(outputs ** 2) by our param names."""
    rnn = torch_rnn(kind, state)
    h0 = data["h0"].unsqueeze(0)
    out, _ = rnn(data["x"], h0 if kind == "gru" else (h0, data["c0"].unsqueeze(0)))
    (out ** 2).mean().backward()
    grads = {"wi": rnn.weight_ih_l0.grad.T, "wh": rnn.weight_hh_l0.grad.T, "bi": rnn.bias_ih_l0.grad,
             "bh": rnn.bias_hh_l0.grad}
    return out.detach(), grads


@pytest.mark.parametrize("devices", ["cpu", "cpu[0 1]", "cpu[0 1 2]"])
def test_the_gru_and_the_lstm_equal_torchs_outputs_and_gradients(devices: str) -> None:
    prog = ss.load(HERE / "rnn.ss", devices=devices)
    try:
        data = sequences()
        for kind, model in (("gru", prog.Gru), ("lstm", prog.Lstm)):
            m = model.init(seed=1)
            state = m.state_dict()
            expected, grads = by_torch(kind, state, data)
            got = getattr(prog, kind)(m, data)
            torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=0, msg=f"{kind} on {devices}")
            assert expected.abs().max() > 0.1  # a real comparison
            # one SGD step of lr 1 moves each param by minus its gradient
            getattr(prog, f"{kind}_step")(m, ss.sgd(m, lr=1.0), data)
            for name, value in m.state_dict().items():
                torch.testing.assert_close(state[name] - value, grads[name], atol=TOLERANCE, rtol=0,
                                           msg=f"{kind}.{name} on {devices}")
    finally:
        prog.stop()
