"""Everything a program does, on the simulated cluster (tests/conftest.py) as on one host: the attention
example, `split H` with `shard params`, checkpoints saved on two hosts and loaded on one, the
models' handles, the workers' own loading, and extern fns: their modules reach the workers through
the controller's sys.path on this loopback cluster, or Ray's runtime_env, and a module no worker
can import is an error saying where, and how to ship it."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from programs import GPT, LINEAR, README
from ray_support import assert_same, digit_batches, train
from safetensors.torch import load_file
from support import ROOT

import shapescript as ss
from shapescript.parallel import cluster as clusters
from shapescript.parallel import shared
from shapescript.runtime.calls import ExternImportError

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.usefixtures("ray_cluster"),
              pytest.mark.filterwarnings("ignore:gpt.ss. sizes given when loading replace:UserWarning")]  # small dims

TWO_HOSTS = "2 x cpu[0 1]"
# A few steps: what is new here is the hosts and the actors' messages (each step's all-reduces, the
# sharded optimizer's state after several updates); tests/several/test_heads.py trains the same GPT
# 20 steps split along H, with and without shard params, on local workers. (20 here: 0.3 s a step on
# two hosts, 13 s in all.)
STEPS = 5
HEADS_DIMS = {"V": 11, "T": 8, "D": 16, "H": 12, "Dh": 2, "F": 32, "L": 2}  # 12 heads: 3 on each of 4 workers
LAYOUTS = {"data parallel": (), "split H and shard params": ("split H", "shard params")}


def gpt(*options: str) -> str:
    """The attention example under a devices line with `options` (the devices it is loaded on replace
    the line's)."""
    return "devices cpu\n" + "".join(f"    {o}\n" for o in options) + GPT


def text_batches(n: int, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """Batches of 7 sequences: 2, 2, 2 and 1 on the 4 workers."""
    g = torch.Generator().manual_seed(seed)
    return [{"tokens": torch.randint(0, 11, (7, 8), generator=g), "targets": torch.randint(0, 11, (7, 8), generator=g)}
            for _ in range(n)]


EXTERN = textwrap.dedent("""\
    devices cpu[0 1]
    dim D = 3
    extern fn twice(x: [b D]) -> [b D] = "{module}.twice"
    fn f(x: [b D]) -> [b D] = twice(x) + 1.0
    """)


def on_the_cluster(prog: Any) -> None:
    assert prog.pool is not None and prog.pool._launcher is not None, "the workers didn't run on the cluster"


@contextmanager
def local_workers() -> Iterator[None]:
    """Pools started in the block run on this machine's own processes, the cluster staying current
    (connect's "pools already running stay where they are"): ss.cluster(None) would end the
    session's connection to the cluster, which every test here shares."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(clusters, "_current", None)
        yield


@contextmanager
def one_pool() -> Iterator[Callable[..., Any]]:
    """A `load` of programs of which each takes over the workers of the one before (as a notebook's
    re-run cell does, Program.adopt_workers): their workers start once. The last one is stopped."""
    last: list[Any] = []

    def load(source: str, devices: str, name: str, dims: dict[str, int] | None = None) -> Any:
        prog = ss.load(source, devices=devices, dims=dims, name=name)
        if last and last[-1].pool is not None:
            assert prog.adopt_workers(last[-1])
        last[:] = [prog]
        return prog
    try:
        yield load
    finally:
        if last:
            last[-1].stop()


class Run:
    """What training the attention example for STEPS steps left: losses, params, the optimizer's
    state, params read one by one through the model's handle, and a checkpoint."""

    def __init__(self, prog: Any, checkpoint: Path) -> None:
        m = prog.Gpt.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        self.losses = [float(prog.train_step(m, opt, b, ss.Eval)) for b in text_batches(STEPS)]
        if prog.several:
            on_the_cluster(prog)
            assert isinstance(m, ss.parallel.RemoteModel) and isinstance(opt, ss.parallel.RemoteOptimizer)
        self.params, self.opt_state = m.state_dict(), opt.state_dict()
        self.handles = {name: getattr(m, name).detach().clone() for name in ("emb", "pos", "head")}
        ss.save(checkpoint, m, opt)  # on the controller's machine, whatever the workers' hosts
        self.checkpoint = checkpoint


def fit_rows(prog: Any, rows: Callable[[int], Any]) -> torch.Tensor:
    """The losses of two epochs of the program's own loop over 21 items of plain Python records (a
    class the workers import, so the dataset is sent to them once, and each loads its part of each
    batch: 8, 8 and 5 items)."""
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    sink = ss.sinks.memory()
    for _ in range(2):  # each epoch a new loop
        prog.fit(m, opt, rows(21), sink)
    if prog.several:
        on_the_cluster(prog)
        assert [w.label.split(" at ")[0] for w in prog.pool._workers][-1] == "cpu:1 on host 1"
    return torch.tensor([r["loss"] for r in sink.records])


EXTERN_INPUT = torch.randn(6, 3, generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    """Every program compared here, on one device and on two hosts, by (what, devices). Their
    modules (an extern fn's, a dataset's class) are on the controller's sys.path only, which the
    workers take on this loopback cluster. On two hosts one pool runs them all: it takes all 4 of
    the cluster's CPUs, and is stopped before the tests that start their own."""
    folder = tmp_path_factory.mktemp("programs")
    (folder / "ss_cluster_externs.py").write_text("def twice(x):\n    return x * 2\n")
    done: dict[tuple[str, str], Any] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        patch.syspath_prepend(str(ROOT / "tests" / "several"))
        from sample_data import Rows
        for devices in ("cpu", TWO_HOSTS):
            with one_pool() as load:
                for layout, options in LAYOUTS.items():
                    if options and devices == "cpu":
                        continue  # one device's run is every layout's reference
                    prog = load(gpt(*options), devices, "gpt.ss", HEADS_DIMS)
                    done[layout, devices] = Run(prog, folder / f"{layout} on {devices}.safetensors")
                done["rows", devices] = fit_rows(load(LINEAR, devices, "fit.ss"), Rows)
                prog = load(EXTERN.replace("{module}", "ss_cluster_externs"), devices, "ext.ss")
                done["extern", devices] = prog.f(EXTERN_INPUT)
                if prog.several:
                    on_the_cluster(prog)
    return done


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=lambda text: f"{name}: {text}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_attention_example_on_two_hosts_equals_one_device(runs: dict[tuple[str, str], Any], layout: str) -> None:
    """STEPS AdamW steps, dropout in Eval; the params, the optimizer's state (RemoteOptimizer) and
    params read through the RemoteModel's handle are one device's within 1e-5."""
    one, two = runs["data parallel", "cpu"], runs[layout, TWO_HOSTS]
    assert_same((one.losses, one.params), (two.losses, two.params))
    close(one.opt_state, two.opt_state)
    assert one.opt_state["head.step"].item() == STEPS
    close(one.handles, two.handles)
    assert two.handles["head"].shape == (HEADS_DIMS["D"], HEADS_DIMS["V"])  # whole, from pieces too


def restored(prog: Any, checkpoint: Path, again: Path) -> dict[str, torch.Tensor]:
    """`checkpoint` restored into a model and optimizer of `prog` made differently, saved again;
    what the model and optimizer hold then, by the checkpoint's keys."""
    m = prog.Gpt.init(seed=2)
    opt = ss.adamw(m, lr=5e-2)
    ss.restore(checkpoint, m, opt)
    assert opt.hyper["lr"] == 1e-3
    ss.save(again, m, opt)
    return {**{f"model.{k}": v for k, v in m.state_dict().items()},
            **{f"opt.{k}": v for k, v in opt.state_dict().items()}}


def test_a_checkpoint_saved_on_two_hosts_loads_on_cpu_and_on_local_cpu01_bit_exact(
        runs: dict[tuple[str, str], Any], tmp_path: Path) -> None:
    """Saved in each layout, loaded on `cpu`, and on `cpu[0 1]` with this machine's own workers,
    then saved again: the same file, and every param and value of the optimizer's state, bit for bit."""
    one = ss.load(gpt(), devices="cpu", name="gpt.ss", dims=HEADS_DIMS)
    two = ss.load(gpt(), devices="cpu[0 1]", name="gpt.ss", dims=HEADS_DIMS)
    try:
        with local_workers():
            two.workers()
        assert two.pool._launcher is None  # this machine's processes
        for layout in LAYOUTS:
            run = runs[layout, TWO_HOSTS]
            saved = load_file(run.checkpoint)
            assert any(k.startswith("opt.") for k in saved)
            for key, value in run.params.items():  # what the workers held, whole
                assert torch.equal(saved[f"model.{key}"], value), key
            for name, prog in (("cpu", one), ("cpu[0 1]", two)):
                again = tmp_path / f"{layout} to {name}.safetensors"
                held = restored(prog, run.checkpoint, again)
                resaved = load_file(again)
                assert resaved.keys() == saved.keys() == held.keys()
                for key in saved:
                    assert torch.equal(resaved[key], saved[key]), (layout, name, key)
                    assert torch.equal(held[key], saved[key]), (layout, name, key)
    finally:
        two.stop()


def trained_and_shared(prog: Any, batches: list[dict[str, torch.Tensor]]) -> tuple[Any, list[int]]:
    """The README MLP's losses and params after a train_step on each batch, and how many of the batches'
    tensors each worker took from shared memory (the `shared_reads` handler) meanwhile."""
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    before = prog.workers().call("shared_reads", ())
    losses = [float(prog.train_step(m, opt, b)) for b in batches]
    reads = [after - b for after, b in zip(prog.workers().call("shared_reads", ()), before)]
    return (losses, m.state_dict()), reads


def test_a_local_pool_shares_memory_while_the_cluster_is_current_and_the_actors_never() -> None:
    """Batches of 128 rows (400 KB of images, over shared.THRESHOLD): a local pool started while
    the cluster is current (as one started before ss.cluster(...), which stays) takes them from shared
    memory, the actors through their connections; both train as one device."""
    batches = digit_batches(3, 128)
    assert batches[0]["img"].numel() * 4 >= shared.THRESHOLD and shared.enabled
    reference = train("cpu", batches)
    for where in ("this machine", "the cluster"):
        prog = ss.load(README, devices="cpu[0 1]", name="mlp.ss")
        try:
            with local_workers() if where == "this machine" else nullcontext():
                prog.workers()
            assert clusters.current() is not None and (prog.pool._launcher is None) == (where == "this machine")
            run, reads = trained_and_shared(prog, batches)
        finally:
            prog.stop()
        assert reads == ([len(batches)] * 2 if where == "this machine" else [0, 0]), where
        assert_same(reference, run)


def test_the_workers_own_loading_of_a_dataset_trains_as_on_one_device(runs: dict[tuple[str, str], Any]) -> None:
    assert len(runs["rows", "cpu"]) == 6
    torch.testing.assert_close(runs["rows", TWO_HOSTS], runs["rows", "cpu"], rtol=1e-5, atol=1e-6)


def test_an_extern_fns_module_on_the_controllers_sys_path_runs_on_the_workers(runs: dict[tuple[str, str], Any]) -> None:
    for devices in ("cpu", TWO_HOSTS):
        torch.testing.assert_close(runs["extern", devices], EXTERN_INPUT * 2 + 1.0, atol=0, rtol=0)


def test_a_module_the_workers_lack_is_an_error_saying_where_and_how_to_ship_it_which_runtime_env_does(
        ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An extern fn's module that the controller imported from a file on no sys.path (as a notebook
    might): the workers can't import it, and say where and how to ship it; with the session's
    connection made again with Ray's runtime_env shipping the file, they can (and again without it
    afterwards)."""
    module = tmp_path / "ss_shipped_externs.py"
    module.write_text("def twice(x):\n    return x * 2\n")
    spec = importlib.util.spec_from_file_location("ss_shipped_externs", module)
    assert spec is not None and spec.loader is not None
    only_here = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(only_here)
    monkeypatch.setitem(sys.modules, "ss_shipped_externs", only_here)
    source = EXTERN.replace("{module}", "ss_shipped_externs")
    expected = EXTERN_INPUT * 2 + 1.0
    here = ss.load(source, devices="cpu", name="ext.ss")
    torch.testing.assert_close(here.f(EXTERN_INPUT), expected)  # the controller has it

    prog = ss.load(source, name="ext.ss")
    try:
        with pytest.raises(ExternImportError) as caught:
            prog.f(EXTERN_INPUT)
    finally:
        prog.stop()
    message = str(caught.value)
    assert "ext.ss:3" in message and "`ss_shipped_externs.twice`" in message, message
    assert "module `ss_shipped_externs` can't be imported on worker 0 (cpu:0 at 127.0.0.1)" in message, message
    assert 'ss.cluster(address, runtime_env={"py_modules": ["path/to/ss_shipped_externs"]})' in message, message
    assert "install `ss_shipped_externs` on every host" in message, message

    try:
        connected = ss.cluster(ray_cluster, runtime_env={"py_modules": [str(module)]})
        assert connected is clusters.current() and connected.we_connected
        prog = ss.load(source, name="ext.ss")
        try:
            torch.testing.assert_close(prog.f(EXTERN_INPUT), expected, atol=0, rtol=0)
            on_the_cluster(prog)
        finally:
            prog.stop()
    finally:
        ss.cluster(ray_cluster)  # the session's connection, without the runtime_env


def test_a_runtime_env_once_ray_is_connected_by_someone_else_is_a_value_error(
        ray_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `ray.init` of the user's own made the connection (we_connected False): Ray can't take a
    runtime_env any more, and nothing changes."""
    theirs = clusters.Cluster(ray_cluster.address, local=True, we_connected=False)
    monkeypatch.setattr(clusters, "_current", theirs)
    with pytest.raises(ValueError, match=r"connected already.*ss\.cluster\(address, runtime_env=\.\.\.\) before"):
        ss.cluster(ray_cluster, runtime_env={"py_modules": []})
    assert clusters.current() is theirs and ray.is_initialized()
    with pytest.raises(ValueError, match="not for ss.cluster"):
        ss.cluster(None, runtime_env={"py_modules": []})
    assert clusters.current() is theirs
