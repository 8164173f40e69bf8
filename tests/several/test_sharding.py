"""`shard params`: each device holds a piece of every param and of its optimizer state, and the
program computes what it computes on one device. Checked against one device (`cpu`), the
DeviceTable's sizes against what the workers hold, and checkpoints between every layout."""

from __future__ import annotations

import itertools

import pytest
import torch
from safetensors.torch import load_file

import shapescript as ss
from programs import GPT, GPT_DIMS, README
from test_comms import sharded
from test_equivalence import compare, digits, run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("devices", ["cpu[0 1]", "cpu[0 1 2]"])
def test_the_readme_mlp_sharded_equals_one_device(devices: str) -> None:
    """20 AdamW steps; on 3 devices w1's 200,704 values and w2's 2,560 are uneven pieces."""
    batches = digits(20, 64, 784, 10)
    compare(run(README, "cpu", "Mlp", batches), run(sharded(README), devices, "Mlp", batches))


def test_the_attention_example_sharded_equals_one_device() -> None:
    """Stacked blocks, an embedding, affine layer_norms and clip_norm of the sharded gradients."""
    g = torch.Generator().manual_seed(1)
    batches = [{"tokens": torch.randint(0, 11, (7, 8), generator=g), "targets": torch.randint(0, 11, (7, 8), generator=g)}
               for _ in range(20)]
    reference = run(GPT, "cpu", "Gpt", batches, (ss.Eval,), GPT_DIMS)
    compare(reference, run(sharded(GPT), "cpu[0 1 2]", "Gpt", batches, (ss.Eval,), GPT_DIMS))


def test_each_device_holds_the_pieces_the_table_says() -> None:
    """What each worker holds is what the DeviceTable says: the README's 271,024 bytes of params on
    3 devices (a third of each param, padded), and AdamW's two moments of each piece."""
    prog = ss.load(sharded(README), devices="cpu[0 1 2]", name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        prog.train_step(m, opt, digits(1, 8, 784, 10)[0])
        held = prog.workers().call("objects", ())
        table = prog.device_table
        pieces = -(-784 * 256 // 3) * 4 + -(-256 * 10 // 3) * 4  # ceil(n / 3) values of 4 bytes each
        assert int(table.models["Mlp"].bytes) == pieces == 271_024
        for worker in held:
            model_bytes, opt_bytes = (worker["bytes"][h] for h in (m._handle, opt._handle))
            assert model_bytes == pieces
            assert opt_bytes == 2 * pieces + 2 * 4  # two moments per value, and each param's step count
        whole = m.state_dict()
        assert whole["w1"].shape == (784, 256) and torch.equal(m.w1, whole["w1"])
    finally:
        prog.stop()


def test_a_norm_of_sharded_gradients_is_the_whole_gradients_norm() -> None:
    source = sharded(README) + (
        "\nfn grad_size(m: Mlp, batch: [b] Digit) -> []:\n"
        "    l, g = value_and_grad(loss, m, batch)\n"
        "    return norm(clip_norm(g, 0.5))\n")
    batch = digits(1, 10, 784, 10)[0]
    sizes = []
    for devices in ("cpu", "cpu[0 1 2]"):
        prog = ss.load(source, devices=devices, name="mlp.ss")
        try:
            sizes.append(float(prog.grad_size(prog.Mlp.init(seed=0), batch)))
        finally:
            prog.stop()
    assert sizes[0] == pytest.approx(0.5, rel=1e-5)  # clipped: the whole gradients' norm is above 0.5
    assert sizes[1] == pytest.approx(sizes[0], rel=1e-5)


LAYOUTS = {"one device": (README, "cpu"), "data parallel": (README, "cpu[0 1]"),
           "sharded on 2": (sharded(README), "cpu[0 1]"), "sharded on 3": (sharded(README), "cpu[0 1 2]")}


@pytest.fixture(scope="module")
def programs():
    progs = {name: ss.load(source, devices=devices, name="mlp.ss") for name, (source, devices) in LAYOUTS.items()}
    yield progs
    for prog in progs.values():
        prog.stop()


def test_checkpoints_move_between_every_layout(programs, tmp_path) -> None:
    """Saved in each layout after two steps, loaded in every other one, saved again: the same file,
    every param and every value of the optimizer's state bit for bit."""
    batches = digits(2, 12, 784, 10, seed=3)
    for source, target in itertools.product(LAYOUTS, repeat=2):
        prog = programs[source]
        m = prog.Mlp.init(seed=1)
        opt = ss.adamw(m, lr=1e-3)
        for b in batches:
            prog.train_step(m, opt, b)
        first = tmp_path / f"{source}.safetensors"
        ss.save(first, m, opt)
        other = programs[target]
        m2 = other.Mlp.init(seed=2)
        opt2 = ss.adamw(m2, lr=5e-2)
        ss.restore(first, m2, opt2)
        again = tmp_path / f"{source} to {target}.safetensors"
        ss.save(again, m2, opt2)
        saved, resaved = load_file(first), load_file(again)
        assert saved.keys() == resaved.keys() and any(k.startswith("opt.") for k in saved)
        for key in saved:
            assert torch.equal(saved[key], resaved[key]), (source, target, key)
        assert opt2.hyper["lr"] == 1e-3
        for name, value in m2.state_dict().items():
            assert torch.equal(value, saved[f"model.{name}"]), (source, target, name)
