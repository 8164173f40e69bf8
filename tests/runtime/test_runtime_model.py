"""Model: deterministic init against hand-written torch calls, params, state, strict loading."""

from __future__ import annotations

import pytest
import torch
from support import ROOT

from shapescript.errors import DomainError, ShapeError
from shapescript.runtime.model import Model, ModelSpec, ParamSpec, SubSpec


def reference_net(seed: int) -> dict[str, torch.Tensor]:
    """What NET's init must draw: the same calls on one generator, in declaration order."""
    g = torch.Generator().manual_seed(seed)
    return {
        "w0": torch.empty(5, 4).normal_(1.0, 0.5, generator=g),
        "enc.w": torch.empty(4, 3).uniform_(-0.5, 0.5, generator=g),
        "enc.b": torch.zeros(3),
        "scale": torch.ones(3),
        "running": torch.empty(3).normal_(0.0, 1.0, generator=g),
        "w64": torch.empty(3, 2, dtype=torch.float64).normal_(0.0, 1.0, generator=g),
        "count": torch.zeros((), dtype=torch.int64),
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("seed", [0, 7, -3, 2**40])
def test_init_is_bit_identical_to_hand_written_draws(net: ModelSpec, seed: int) -> None:
    m = Model.init(net, seed=seed)
    assert_same(m.state_dict(), reference_net(seed))


def test_init_of_the_readme_mlp(mlp: ModelSpec) -> None:
    g = torch.Generator().manual_seed(0)
    w1 = torch.empty(784, 256).normal_(0.0, 0.02, generator=g)
    w2 = torch.empty(256, 10).normal_(0.0, 0.02, generator=g)
    m = Model.init(mlp, seed=0)
    assert torch.equal(m.w1, w1) and torch.equal(m.w2, w2)
    assert not torch.equal(Model.init(mlp, seed=1).w1, w1)


def test_members_are_plain_attributes(net: ModelSpec) -> None:
    m = Model.init(net, seed=0)
    assert isinstance(m.enc, Model) and m.enc.spec.name == "Enc"
    assert m.enc.w.shape == (4, 3)
    for p in m.params():
        assert p.is_leaf and p.requires_grad
    assert not m.running.requires_grad and not m.count.requires_grad


def test_params_are_trained_members_in_declaration_order(net: ModelSpec) -> None:
    m = Model.init(net, seed=0)
    names = [n for n, _ in m.named_params()]
    assert names == ["w0", "enc.w", "enc.b", "scale", "w64"]
    expected = [m._leaf(n) for n in ("w0", "enc.w", "enc.b", "scale", "w64")]
    assert all(a is b for a, b in zip(m.params(), expected)) and len(m.params()) == 5
    assert m.params() is m.params()  # cached for the hot path
    assert all(a is b for (_, a), b in zip(m.named_params(), expected))


def test_params_are_the_models_own_tensors_as_the_docs_say(net: ModelSpec) -> None:
    """Unlike a field read from Python, params() gives what the optimizer updates: changing one in
    place changes the model. docs/api.md says so, beside "a model changes through ..." ."""
    m = Model.init(net, seed=0)
    copy = m.w0
    with torch.no_grad():
        copy.mul_(0)  # a field's copy: the model is as it was
        assert bool(m.w0.abs().sum() > 0)
        m.params()[0].mul_(0)
    assert torch.equal(m.w0, torch.zeros_like(m.w0)) and torch.equal(m.state_dict()["w0"], m.w0)
    docs = " ".join((ROOT / "docs" / "api.md").read_text().split())
    assert ("or through `ss.restore`; and on one device through its own tensors that `m.params()` lists, as an "
            "optimizer changes them: `m.params()[0].mul_(0)` under `torch.no_grad()` zeroes `w1`") in docs


def test_state_dict_holds_detached_copies(net: ModelSpec) -> None:
    m = Model.init(net, seed=0)
    state = m.state_dict()
    assert set(state) == {"w0", "enc.w", "enc.b", "scale", "running", "w64", "count"}
    state["w0"].add_(1.0)
    assert not torch.equal(state["w0"], m.w0)
    assert not state["w0"].requires_grad


def test_init_on_a_device_string(mlp: ModelSpec) -> None:
    m = Model.init(mlp, seed=0, device="cpu")
    assert m.w1.device.type == "cpu" and m.w1.is_leaf
    with pytest.raises(DomainError, match="Mlp.init: 'gpu7' is not a device"):
        Model.init(mlp, seed=0, device="gpu7")


@pytest.mark.parametrize("seed", ["0", 1.5, True, None])
def test_seed_must_be_an_int(mlp: ModelSpec, seed: object) -> None:
    with pytest.raises(TypeError, match="seed must be an int"):
        Model.init(mlp, seed=seed)  # type: ignore[arg-type]


def test_load_state_dict_round_trip_in_place(net: ModelSpec) -> None:
    a, b = Model.init(net, seed=0), Model.init(net, seed=1)
    w0, params = b._leaf("w0"), b.params()
    b.load_state_dict(a.state_dict())
    assert_same(b.state_dict(), a.state_dict())
    assert b._leaf("w0") is w0 and b.params() is params and w0.requires_grad and w0.is_leaf


def failing_load(m: Model, state: dict[str, object]) -> str:
    before = m.state_dict()
    with pytest.raises(ShapeError) as info:
        m.load_state_dict(state)  # type: ignore[arg-type]
    assert_same(m.state_dict(), before)  # nothing half-changed
    return str(info.value)


def test_load_wrong_shape_names_member_and_location(net: ModelSpec) -> None:
    m = Model.init(net, seed=0)
    state = Model.init(net, seed=1).state_dict()
    state["w64"] = torch.zeros(2, 3, dtype=torch.float64)  # after valid members: all checked first
    msg = failing_load(m, state)
    assert msg == ("load_state_dict: `w64` is [2, 3] f64, expected [3, 2] f64 "
                   "(declared at mlp.ss:16:5)")


def test_load_wrong_dtype(net: ModelSpec) -> None:
    m = Model.init(net, seed=0)
    state = m.state_dict()
    state["enc.w"] = state["enc.w"].double()
    assert "`enc.w` is [4, 3] f64, expected [4, 3] f32 (declared at mlp.ss:3:5)" in \
        failing_load(m, state)


def test_load_lists_every_problem(net: ModelSpec) -> None:
    m = Model.init(net, seed=0)
    state: dict[str, object] = dict(Model.init(net, seed=1).state_dict())
    del state["running"]
    state["extra"] = torch.zeros(1)
    state["scale"] = [1.0, 1.0, 1.0]
    msg = failing_load(m, state)
    assert "the state does not fit Net (declared at mlp.ss:11:1)" in msg
    assert "`running` is missing, expected [3] f32 (declared at mlp.ss:15:5)" in msg
    assert "`extra` is not a member of Net" in msg
    assert "`scale` is a list, expected a tensor [3] f32" in msg


def test_load_of_a_non_mapping(mlp: ModelSpec) -> None:
    msg = failing_load(Model.init(mlp, seed=0), [])  # type: ignore[arg-type]
    assert msg == "load_state_dict: expected a dict of tensors for Mlp, got list"


def test_repr(net: ModelSpec) -> None:
    assert repr(Model.init(net, seed=0)) == (
        "Net(w0: [5, 4] f32, enc: Enc(w: [4, 3] f32, b: [3] f32), scale: [3] f32, "
        "running: [3] f32 buffer, w64: [3, 2] f64, count: [] i64 buffer)")


def spec_with(*members: ParamSpec | SubSpec) -> ModelSpec:
    return ModelSpec("Bad", members, "bad.ss:1:1")


def p(name: str, **kw: object) -> ParamSpec:
    fields: dict[str, object] = dict(name=name, kind="param", shape=(2,), dtype=torch.float32,
                                     init="zeros", init_args=(), where="bad.ss:2:5")
    fields.update(kw)
    return ParamSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [
    lambda: spec_with(p("params")),  # would hide Model.params
    lambda: spec_with(p("w"), p("w")),
    lambda: p("w", dtype=torch.int64),  # a trained param must be float
    lambda: p("w", init="normal", init_args=(("sigma", 1.0),)),
    lambda: p("w", init="xavier"),
    lambda: p("w", kind="buffer", init="normal", dtype=torch.int32),
])
def test_malformed_specs_fail_when_built(make: object) -> None:
    with pytest.raises(ValueError, match="bad.ss:2:5"):
        make()  # type: ignore[operator]
