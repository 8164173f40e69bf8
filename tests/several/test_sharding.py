"""`shard params`: each device holds a piece of every param and of its optimizer state, and the
program computes what it computes on one device. Checked against one device (`cpu`), the
DeviceTable's sizes against what the workers hold, and checkpoints between every layout."""

from __future__ import annotations

import pytest
import torch
from checkpoints import check_checkpoints_move
from programs import BATCH_NORM, GPT, GPT_DIMS, README
from support import cli
from test_comms import sharded
from test_equivalence import compare, digits, run

import shapescript as ss

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


def test_buffers_stay_whole_beside_sharded_params() -> None:
    """batch_norm's running statistics (buffers) stay whole and are updated on every device."""
    g = torch.Generator().manual_seed(2)
    batches = [{"x": torch.randn(10, 6, generator=g), "y": torch.randint(0, 3, (10,), generator=g)} for _ in range(20)]
    reference = run(BATCH_NORM, "cpu", "Net", batches, (ss.Train(seed=0),))
    compare(reference, run("devices cpu\n    shard params\n" + BATCH_NORM, "cpu[0 1 2]", "Net", batches,
                           (ss.Train(seed=0),)))


def test_the_programs_own_loop_trains_sharded_params_as_one_device(tmp_path) -> None:
    """The README's `run`: the workers load their parts of each batch, the pieces train; the loss
    written each step and the optimizer's state, whole from Python, are one device's."""
    data = ss.TensorDataset(img=torch.randn(100, 784, generator=torch.Generator().manual_seed(4)),
                            label=torch.arange(100) % 10)
    results = []
    for source, devices in ((README, "cpu"), (sharded(README), "cpu[0 1 2]")):
        prog = ss.load(source, devices=devices, name="mlp.ss")
        try:
            m = prog.Mlp.init(seed=0)
            opt = ss.adamw(m, lr=1e-3)
            log = ss.sinks.memory()
            prog.run(m, opt, data, log)
            losses = [record["loss"] for record in log.records]
            state = opt.state_dict()
            results.append((losses, m.state_dict(), state))
        finally:
            prog.stop()
    (losses, params, state), (losses_3, params_3, state_3) = results
    assert len(losses) == len(losses_3) == 2  # batches of 64 from 100 examples
    assert losses_3 == pytest.approx(losses, abs=1e-5)
    assert state.keys() == state_3.keys() == {f"{p}.{k}" for p in ("w1", "w2") for k in ("step", "exp_avg", "exp_avg_sq")}
    for key in state:
        torch.testing.assert_close(state_3[key], state[key], atol=1e-6, rtol=1e-5, msg=key)
    for key in params:
        torch.testing.assert_close(params_3[key], params[key], atol=1e-5, rtol=0, msg=key)


def test_a_checkpoint_that_does_not_fit_changes_no_piece(tmp_path) -> None:
    other = tmp_path / "other.safetensors"
    small = ss.load(README.replace("dim Hd = 256", "dim Hd = 16"), devices="cpu", name="small.ss")
    ss.save(other, small.Mlp.init(seed=0))
    prog = ss.load(sharded(README), devices="cpu[0 1]", name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        before = m.state_dict()
        with pytest.raises(ss.ShapeError, match="w1.*784, 16"):
            ss.restore(other, m)
        after = m.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)
    finally:
        prog.stop()


def test_shapescript_comms_shows_each_devices_pieces(tmp_path) -> None:
    """The chapter's figure: the README on cuda[0 1 2] with shard params holds 271,024 bytes of its
    params on each device; each read sends an all-gather of the param padded to 3 pieces."""
    path = tmp_path / "mlp.ss"
    path.write_text(sharded(README))
    out = cli("comms", str(path)).stdout
    assert "each device holds a third of every param of Mlp, 271,024 bytes (265 KiB) of its params" in out
    assert "all-gather of `Mlp`'s param `w1`" in out and f"{-(-784 * 256 // 3) * 3:,} × f32" in out
    assert "reduce-scatter of the gradient of `w2`" in out
    assert "gradients of `Mlp`'s params" not in out  # no all-reduce of whole gradients


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

    def train(prog, m, opt) -> None:
        for b in batches:
            prog.train_step(m, opt, b)
    check_checkpoints_move(programs, "Mlp", train, tmp_path)
