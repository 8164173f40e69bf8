"""The optimizer types (`AdamW[M]`, `Adam[M]`, `Sgd[M]`, `Rmsprop[M]`, `Adagrad[M]`, `Adadelta[M]`):
what the checker accepts and refuses, the DeviceTable's estimate of each one's state against the
state torch's optimizer keeps after a step, and the run time's check of the kind at a call."""

from __future__ import annotations

import programs as P
import pytest
import torch
from facts import build, diagnostics, line_of

import shapescript as ss
from shapescript.optimizers import FACTS, OptimizerKind
from shapescript.plan.comms import device_table

D, C = 4, 3
TORCH = {OptimizerKind.ADAMW: torch.optim.AdamW, OptimizerKind.ADAM: torch.optim.Adam,
         OptimizerKind.SGD: torch.optim.SGD, OptimizerKind.RMSPROP: torch.optim.RMSprop,
         OptimizerKind.ADAGRAD: torch.optim.Adagrad, OptimizerKind.ADADELTA: torch.optim.Adadelta}


def with_kind(kind: str) -> str:
    return P.LINEAR.replace("AdamW[Lin]", f"{kind}[Lin]")


def torch_state_bytes(kind: OptimizerKind) -> int:
    """The bytes of the tensors of the param's size torch's optimizer keeps after a step, at its
    defaults (the step counts aside)."""
    p = torch.zeros(D, C, requires_grad=True)
    opt = TORCH[kind]([p], lr=0.1)
    p.sum().backward()
    opt.step()
    return sum(t.numel() * t.element_size() for t in opt.state[p].values()
               if isinstance(t, torch.Tensor) and t.shape == p.shape)


@pytest.mark.parametrize("kind", list(OptimizerKind))
def test_each_kind_types_and_the_table_gives_its_states_size(kind: OptimizerKind) -> None:
    table = device_table(build(with_kind(kind.value), "cpu[0 1]"))
    opt = next(v for v in table.values if v.fn == "step" and v.name == "opt")
    assert opt.type == f"{kind.value}[Lin]" and opt.kind == "optimizer"
    if FACTS[kind].state_per_param is None:  # it depends on the settings: the table gives no figure
        assert opt.bytes is None
    else:
        assert int(opt.bytes) == torch_state_bytes(kind)
    assert opt.state == FACTS[kind].state_text


def test_a_misspelt_kind_an_optimizer_of_data_and_of_another_model_are_refused() -> None:
    misspelt = diagnostics(with_kind("Adamw"), "cpu")  # in step and in fit
    assert len(misspelt) == 2 and all(d.code == "E0204" and "did you mean `AdamW`?" in d.help for d in misspelt)
    of_data = with_kind("Adam").replace("mut opt: Adam[Lin]", "mut opt: Adam[Ex]")
    assert [(d.code, d.message) for d in diagnostics(of_data, "cpu")] == [("E0204", "`Adam[...]` takes a model")] * 2
    other = P.LINEAR + "\nmodel Other:\n    param v: [D] = zeros()\n"
    source = other.replace("mut opt: AdamW[Lin], batch", "mut opt: Adagrad[Other], batch", 1)
    at_update = [d for d in diagnostics(source, "cpu") if d.span.line == line_of(source, "update(mut m, mut opt, g)")]
    assert [(d.code, d.message) for d in at_update] == [("E0401", "`update` needs an optimizer of `Lin`, not Adagrad[Other]")]


def test_a_call_checks_the_optimizers_kind_at_run_time() -> None:
    prog = ss.load(with_kind("Rmsprop"), devices="cpu", name="fit.ss")
    m = prog.Lin.init(seed=0)
    g = torch.Generator().manual_seed(0)
    batch = ss.TensorDataset(x=torch.randn(8, D, generator=g), y=torch.randint(0, C, (8,), generator=g))
    with pytest.raises(ss.ShapeError, match=r"Rmsprop\[Lin\]"):
        prog.fit(m, ss.adamw(m), batch, ss.sinks.memory())
    prog.fit(m, ss.rmsprop(m), batch, ss.sinks.memory())
