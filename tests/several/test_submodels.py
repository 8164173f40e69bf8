"""Reading sub-models from Python on several devices: `m.ln_f`, `m.blocks[1].attn.w_o` and `hasattr`
answer on N devices as on one, with every field whole in every layout (plain, `split H` with
`shard params`), before and after a step. The reference is the same program on `cpu`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from programs import GPT

import shapescript as ss

pytestmark = pytest.mark.slow

# Tiny: 12 heads, 6 a device on 2, 4 on 3; two blocks, each with sub-models of its own.
DIMS = {"V": 11, "T": 8, "D": 16, "H": 12, "Dh": 2, "F": 32, "L": 2}
LAYOUTS = [("cpu[0 1]", ()), ("cpu[0 1 2]", ()), ("cpu[0 1 2]", ("split H", "shard params"))]

# Every leaf reached through sub-models, as one device's model reads them.
PATHS = ["ln_f.gain", "ln_f.bias", "blocks.0.attn.w_qkv", "blocks.1.attn.w_o", "blocks.1.mlp.w1",
         "blocks.0.ln2.bias", "emb"]


def text_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"tokens": torch.randint(0, 11, (5, 8), generator=g), "targets": torch.randint(0, 11, (5, 8), generator=g)}


def load(devices: str, options: tuple[str, ...]) -> Any:
    source = "devices cpu\n" + "".join(f"    {o}\n" for o in options) + GPT
    with pytest.warns(UserWarning, match="sizes given when loading"):
        return ss.load(source, devices=devices, dims=DIMS, name="gpt.ss")


def read(model: Any, dotted: str) -> torch.Tensor:
    """A leaf by its dotted name, one attribute or index at a time, as a user would write it."""
    value = model
    for part in dotted.split("."):
        value = value[int(part)] if part.isdigit() else getattr(value, part)
    return value.detach() if isinstance(value, torch.Tensor) else value


def stepped(prog: Any) -> tuple[Any, Any]:
    """A model straight after init, and one after a step of AdamW."""
    fresh, trained = prog.Gpt.init(seed=0), prog.Gpt.init(seed=0)
    prog.train_step(trained, ss.adamw(trained, lr=1e-2), text_batch(), ss.Eval)
    return fresh, trained


@pytest.fixture(scope="module")
def one() -> Iterator[tuple[Any, Any]]:
    prog = load("cpu", ())
    yield stepped(prog)


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: " ".join((p[0], *p[1])))
def several(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    prog = load(*request.param)
    try:
        yield stepped(prog)
    finally:
        prog.stop()


def test_every_field_of_a_sub_model_reads_whole_as_on_one_device(one, several) -> None:
    for (reference, model), exact in zip(zip(one, several), (True, False)):
        for dotted in PATHS:
            want, got = read(reference, dotted), read(model, dotted)
            if exact:  # as drawn: every layout's parts put back together are the same numbers
                assert torch.equal(got, want), dotted
            else:  # after a step: up to the order of the additions
                torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=dotted)


def test_a_stack_reads_as_a_tuple_and_a_sub_models_state_as_one_devices(one, several) -> None:
    reference, model = one[1], several[1]
    assert isinstance(model.blocks, tuple) and all(isinstance(b, ss.parallel.RemoteSubModel) for b in model.blocks)
    assert len(model.blocks) == len(reference.blocks) == 2
    block, want = model.blocks[1], reference.blocks[1]
    assert block.spec.name == want.spec.name == "Block" and model.ln_f.spec.name == "Norm"
    state, want_state = block.state_dict(), want.state_dict()
    assert list(state) == list(want_state)  # `attn.w_qkv`, ...: named within the block, in the same order
    for name in want_state:
        torch.testing.assert_close(state[name], want_state[name], atol=1e-5, rtol=0, msg=name)
    assert [n for n, _ in block.named_params()] == [n for n, _ in want.named_params()]
    assert set(dir(block)) >= {"ln1", "attn", "ln2", "mlp"}


def test_hasattr_says_what_one_device_says(one, several) -> None:
    reference, model = one[0], several[0]
    for holder, want in ((model, reference), (model.blocks[0], reference.blocks[0]), (model.ln_f, reference.ln_f)):
        for name in ("blocks", "ln_f", "attn", "mlp", "gain", "w_qkv", "nothing", "_shard", "spec"):
            assert hasattr(holder, name) == hasattr(want, name), name


def test_a_sub_model_is_read_only(several) -> None:
    model = several[0]
    with pytest.raises(AttributeError, match="can't be changed from Python"):
        model.ln_f.gain = torch.zeros(16)
    with pytest.raises(AttributeError, match="can't be changed from Python"):
        model.blocks[0].attn = model.blocks[1].attn
    before = read(model, "ln_f.gain")
    read(model, "ln_f.gain").add_(1.0)  # a copy: the model keeps its value
    assert torch.equal(read(model, "ln_f.gain"), before)
