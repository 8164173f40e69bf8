"""Several devices from Python and from the controller: handles, loops, checkpoints, bad items."""

from __future__ import annotations

import pytest
import torch
from programs import LINEAR

import shapescript as ss

PROGRAM = LINEAR


def dataset(n: int = 21) -> ss.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return ss.TensorDataset(x=torch.randn(n, 4, generator=g), y=torch.randint(0, 3, (n,), generator=g))


@pytest.fixture(scope="module")
def two():
    prog = ss.load(PROGRAM, devices="cpu[0 1]", name="fit.ss")
    yield prog
    prog.stop()


@pytest.mark.slow
def test_remote_model_reads_and_refuses_changes(two) -> None:
    m = two.Lin.init(seed=0)
    local = ss.load(PROGRAM, devices="cpu", name="fit.ss").Lin.init(seed=0)
    assert isinstance(m, ss.parallel.RemoteModel)
    assert torch.equal(m.w, local.w.detach()) and torch.equal(m.state_dict()["w"], local.w.detach())
    with pytest.raises(AttributeError, match="can't be changed from Python"):
        m.w = torch.zeros(4, 3)
    x = torch.randn(5, 4)
    torch.testing.assert_close(two.scores(m, x), x @ local.w.detach())  # each worker's rows, joined in order


@pytest.mark.slow
def test_controller_loop_matches_one_device(two) -> None:
    one = ss.load(PROGRAM, devices="cpu", name="fit.ss")
    logs = []
    for prog in (one, two):
        m = prog.Lin.init(seed=0)
        sink = ss.sinks.memory()
        prog.fit(m, ss.adamw(m, lr=0.1), dataset(), sink)
        logs.append(([r["loss"] for r in sink.records], m.state_dict()["w"]))
    assert len(logs[0][0]) == 3
    assert logs[1][0] == pytest.approx(logs[0][0], abs=1e-6)
    torch.testing.assert_close(logs[1][1], logs[0][1].detach(), atol=1e-6, rtol=0)


@pytest.mark.slow
def test_checkpoints_move_between_one_device_and_several(two, tmp_path) -> None:
    one = ss.load(PROGRAM, devices="cpu", name="fit.ss")
    m2 = two.Lin.init(seed=0)
    opt2 = ss.adamw(m2, lr=0.1)
    two.fit(m2, opt2, dataset(), ss.sinks.memory())
    ss.save(tmp_path / "two.safetensors", m2, opt2)
    m1 = one.Lin.init(seed=5)
    opt1 = ss.adamw(m1, lr=0.1)
    ss.restore(tmp_path / "two.safetensors", m1, opt1)
    assert torch.equal(m1.w.detach(), m2.w)
    ss.save(tmp_path / "one.safetensors", m1, opt1)
    m3 = two.Lin.init(seed=7)
    ss.restore(tmp_path / "one.safetensors", m3)
    assert torch.equal(m3.w, m1.w.detach())


@pytest.mark.slow
def test_a_bad_item_raises_in_the_controller_and_changes_nothing(two) -> None:
    class Bad:
        def __len__(self) -> int:
            return 8  # one batch, which holds the bad item

        def __getitem__(self, i: int) -> dict:
            return {"x": [0.0] * (3 if i == 6 else 4), "y": 1}

    m = two.Lin.init(seed=0)
    before = m.state_dict()["w"]
    with pytest.raises(ss.ShapeError, match="item 6"):
        two.fit(m, ss.adamw(m, lr=0.1), Bad(), ss.sinks.memory())  
    assert torch.equal(m.state_dict()["w"], before)


@pytest.mark.slow
def test_after_a_worker_dies_its_models_are_gone_and_a_new_start_works() -> None:
    import os
    import signal
    import threading

    prog = ss.load(PROGRAM, devices="cpu[0 1]", name="fit.ss")
    try:
        m = prog.Lin.init(seed=0)
        pool = prog._pool
        victim = pool.pids[1]
        threading.Timer(0.5, os.kill, (victim, signal.SIGKILL)).start()
        with pytest.raises(ss.WorkerError, match="worker 1"):
            pool.call("sleep", (30,), where="a long step")
        with pytest.raises(ss.WorkerError, match="make new models, or load a checkpoint"):
            prog.scores(m, torch.zeros(2, 4))
        fresh = prog.Lin.init(seed=0)  # a new pool starts
        assert prog.scores(fresh, torch.zeros(2, 4)).shape == (2, 3)
        assert prog._pool is not pool and not pool.alive
    finally:
        prog.stop()


@pytest.mark.slow
def test_extern_fns_run_on_the_workers_but_not_from_the_main_script() -> None:
    src = ('dim D = 3\nextern fn ln(x: [b D], over: Axis[D]) -> [b D] = "shapescript.std.layer_norm"\n'
           'fn f(x: [b D]) -> [b D] = ln(x, over=D)\n')
    prog = ss.load(src, devices="cpu[0 1]", name="e.ss")
    try:
        x = torch.arange(15.0).reshape(5, 3)
        torch.testing.assert_close(prog.f(x), torch.nn.functional.layer_norm(x, (3,)))
    finally:
        prog.stop()
    main = ss.load(src.replace("shapescript.std.layer_norm", "__main__.layer_norm"), devices="cpu[0 1]", name="m.ss")
    try:
        with pytest.raises(ImportError, match="the script the controller runs"):
            main.f(torch.zeros(2, 3))
    finally:
        main.stop()


@pytest.mark.slow
def test_workers_load_their_parts_and_agree_before_the_step(two) -> None:
    from sample_data import BadAt

    m = two.Lin.init(seed=0)
    before = m.state_dict()["w"]
    for bad in (0, 7):  # the first worker's part, then the second's
        with pytest.raises(ss.ShapeError, match=f"item {bad} of the dataset: field `x` has shape \\[3\\]"):
            two.fit(m, ss.adamw(m, lr=0.1), BadAt(bad), ss.sinks.memory())
        assert torch.equal(m.state_dict()["w"], before)  # no worker started the step
    fine = BadAt(-1)
    sink = ss.sinks.memory()
    two.fit(m, ss.adamw(m, lr=0.1), fine, sink)
    one = ss.load(PROGRAM, devices="cpu", name="fit.ss")
    ref = one.Lin.init(seed=0)
    ref_sink = ss.sinks.memory()
    one.fit(ref, ss.adamw(ref, lr=0.1), fine, ref_sink)
    assert sink.records[0]["loss"] == pytest.approx(ref_sink.records[0]["loss"], abs=1e-6)


@pytest.mark.slow
def test_a_tensor_dataset_is_checked_whole_when_the_workers_keep_it(two) -> None:
    bad = ss.TensorDataset(x=torch.zeros(10, 4), y=torch.tensor([0, 1, 2, 0, 1, 2, 0, 9, 1, 2]))
    m = two.Lin.init(seed=0)
    with pytest.raises(ss.DomainError, match="item 7"):
        two.fit(m, ss.adamw(m, lr=0.1), bad, ss.sinks.memory())


@pytest.mark.slow
def test_workers_take_the_controllers_numerical_settings() -> None:
    src = "fn scale(x: [n]) -> [n] = x * 0.5\n"
    tiny = torch.tensor([1e-39, 2e-39, 1.0, 3e-39], dtype=torch.float32)
    torch.set_flush_denormal(True)
    try:
        one = ss.load(src, devices="cpu", name="s.ss").scale(tiny)
        prog = ss.load(src, devices="cpu[0 1]", name="s.ss")
        try:
            two = prog.scale(tiny)
        finally:
            prog.stop()
    finally:
        torch.set_flush_denormal(False)
    assert one.tolist() == [0.0, 0.0, 0.5, 0.0]  # flushed here, so the workers must flush too
    assert torch.equal(two, one)


BIASED = PROGRAM.replace("    param w: [D C] = normal(std=0.1)\n",
                         "    param w: [D C] = normal(std=0.1)\n    param b: [C] = normal(std=0.1)\n").replace("= x @ m.w\n", "= x @ m.w + m.b\n")


@pytest.mark.slow
def test_param_groups_train_alike_on_every_device_count_and_restore_their_settings(tmp_path) -> None:
    """`no_decay=` (here: the bias) on cpu, cpu[0 1] and cpu[0 1 2]: the same params after a
    loop; a checkpoint restored on two devices brings its settings to the controller's handle."""
    assert "param b" in BIASED and "+ m.b" in BIASED
    results = {}
    for devices in ("cpu", "cpu[0 1]", "cpu[0 1 2]"):
        prog = ss.load(BIASED, devices=devices, name="fit.ss")
        try:
            m = prog.Lin.init(seed=0)
            opt = ss.adamw(m, lr=0.1, weight_decay=0.5, no_decay=lambda name, p: p.ndim < 2)
            assert opt.hyper["no_decay"] == ["b"]
            prog.fit(m, opt, dataset(), ss.sinks.memory())
            results[devices] = m.state_dict()
            if devices == "cpu[0 1]":
                ss.save(tmp_path / "groups.safetensors", m, opt)
                plain = ss.adamw(m, lr=0.3)
                ss.restore(tmp_path / "groups.safetensors", m, plain)
                assert plain.hyper["no_decay"] == ["b"] and plain.hyper["lr"] == 0.1
        finally:
            prog.stop()
    for devices in ("cpu[0 1]", "cpu[0 1 2]"):
        for name, t in results["cpu"].items():
            torch.testing.assert_close(results[devices][name], t.detach(), atol=1e-6, rtol=0)
    one = ss.load(BIASED, devices="cpu", name="fit.ss")
    m = one.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1, weight_decay=0.5)  # every param decays: the bias ends elsewhere
    one.fit(m, opt, dataset(), ss.sinks.memory())
    assert not torch.allclose(m.b.detach(), results["cpu"]["b"].detach(), atol=1e-4)
