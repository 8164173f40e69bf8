"""Handles from Python, alike on every device count: names never meet the handles' own attributes,
a field read from Python is a copy, and a handle whose workers stopped raises without starting any."""

from __future__ import annotations

import copy
import pickle
import sys
import textwrap
import types
from collections.abc import Iterator

import pytest
import torch
from programs import LINEAR

import shapescript as ss
from shapescript.errors import CompileError
from shapescript.names import DATA_RESERVED, MEMBER_PREFIX, MODEL_RESERVED
from shapescript.parallel.loading import RemoteBatch
from shapescript.parallel.remote import RemoteModel, RemoteOptimizer
from shapescript.runtime.data import Batch
from shapescript.runtime.model import Model

# Members and fields named as the handles' attributes were before they kept them out of the way.
CLASHES = textwrap.dedent("""\
    dim D = 3

    data Ex:
        number: [D]
        indices: [D]

    model Net:
        param handle: [D D] = normal(std=0.5)
        param pool: [D] = normal(std=0.5)
        buffer workers: [D] = ones()

    fn apply(m: Net, x: [b D]) -> [b D] = x @ m.handle + m.pool * m.workers

    fn show(data: Dataset[Ex]):
        for batch in data |> batches(4):
            print(batch.number)
            print(batch.indices)
    """)
DEVICES = ["cpu", "cpu[0 1]"]


@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, ss.Program]]:
    progs = {d: ss.load(CLASHES, devices=d, name="clash.ss") for d in DEVICES}
    yield progs
    for prog in progs.values():
        prog.stop()


def examples() -> ss.TensorDataset:
    return ss.TensorDataset(number=torch.arange(18.0).reshape(6, 3), indices=-torch.arange(18.0).reshape(6, 3))


@pytest.mark.slow
@pytest.mark.parametrize("devices", DEVICES)
def test_members_named_as_handle_attributes_read_back_as_tensors(programs, devices: str) -> None:
    one = programs["cpu"].Net.init(seed=0)
    m = programs[devices].Net.init(seed=0)
    for name in ("handle", "pool", "workers"):
        got = getattr(m, name)
        assert isinstance(got, torch.Tensor), f"`{name}` read back as {type(got).__name__}"
        assert torch.equal(got, getattr(one, name))
    assert torch.equal(m.workers, torch.ones(3))  # the buffer, as declared
    x = torch.randn(5, 3)
    torch.testing.assert_close(programs[devices].apply(m, x), x @ one.handle + one.pool * one.workers)


@pytest.mark.slow
@pytest.mark.parametrize("devices", DEVICES)
def test_params_are_the_trained_params_alone_on_every_device_count(programs, devices: str) -> None:
    """params() and named_params(): the trained params (not the buffer `workers`), in one device's
    order; on one device the model's own tensors, on several copies that change nothing when edited."""
    m = programs[devices].Net.init(seed=0)
    one = programs["cpu"].Net.init(seed=0)
    assert [n for n, _ in m.named_params()] == ["handle", "pool"]
    assert len(m.params()) == 2
    assert all(torch.equal(a, b) for a, b in zip(m.params(), one.params()))
    with torch.no_grad():
        m.params()[0].mul_(0)
    changed = torch.equal(m.handle, torch.zeros(3, 3))
    assert changed == (devices == "cpu")  # one device: its own tensors; several: copies


@pytest.mark.slow
def test_fields_named_as_batch_attributes_read_back_as_tensors(programs, capsys) -> None:
    printed = {}
    for devices, prog in programs.items():
        prog.show(examples())
        printed[devices] = capsys.readouterr().out
    # Two batches of 4 and 2, each field printed whole: the controller reads the tensor, not the batch's number.
    assert printed["cpu"].count("tensor(") == 4 and "-15." in printed["cpu"]
    assert printed["cpu[0 1]"] == printed["cpu"]


@pytest.mark.parametrize("name", sorted(MODEL_RESERVED | {"_hidden"}))
def test_a_reserved_member_name_is_a_compile_error(name: str) -> None:
    src = f"model M:\n    param {name}: [3] = zeros()\n"
    with pytest.raises(CompileError) as info:
        ss.load(src, name="r.ss")
    assert info.value.codes == ["E0207"]
    d = info.value.diagnostics[0]
    assert (d.line, d.column) == (2, 11)  # at the name, after `param `
    assert "is reserved: a model has it already" in str(info.value) and "`state_dict`" in str(info.value)


@pytest.mark.parametrize("name", sorted(DATA_RESERVED | {"_hidden"}))
def test_a_reserved_field_name_is_a_compile_error(name: str) -> None:
    src = f"data Ex:\n    x: [3]\n    {name}: [3]\n"
    with pytest.raises(CompileError) as info:
        ss.load(src, name="r.ss")
    assert info.value.codes == ["E0207"]
    assert (info.value.diagnostics[0].line, info.value.diagnostics[0].column) == (3, 5)
    assert "is reserved: a batch has it already" in str(info.value) and "`lengths`" in str(info.value)


def handle_instances() -> list[tuple[object, set[str], frozenset[str]]]:
    """One of each handle class, with the names of its members or fields and the names reserved for them."""
    prog = ss.load(CLASHES, devices="cpu", name="clash.ss")
    spec = prog.Net.spec
    members = {m.name for m in spec.members}
    fields = {"number", "indices"}
    stub = types.SimpleNamespace(_pool=None, devices="cpu[0 1]")
    batch = Batch(prog.Ex, {"number": torch.zeros(2, 3), "indices": torch.zeros(2, 3)})
    return [(Model.init(spec, seed=0), members, MODEL_RESERVED),
            (RemoteModel(stub, spec, handle=1), members, MODEL_RESERVED),
            (batch, fields, DATA_RESERVED),
            (RemoteBatch(("plan",), 0, examples(), 2, lambda: [0, 1], prog.Ex), fields, DATA_RESERVED)]


@pytest.mark.parametrize("index", range(4))
def test_every_public_attribute_of_a_handle_is_reserved(index: int) -> None:
    handle, own_names, reserved = handle_instances()[index]
    public = {n for n in dir(handle) if not n.startswith("_")} - own_names
    assert public <= reserved, f"{type(handle).__name__} has {sorted(public - reserved)}, which no list reserves"
    # A member `w` lives as `_m_w`: no attribute of a model's own may start so.
    assert not [n for n in dir(type(handle)) if n.startswith(MEMBER_PREFIX)]


def test_generated_code_reads_the_live_tensors_by_interned_names() -> None:
    prog = ss.load(CLASHES, name="clash.ss")
    body = prog.python_source.split("def apply(m, x):")[1].split("\n")[1]
    assert all(f"m._m_{name}" in body for name in ("handle", "pool", "workers")) and "m.handle" not in body
    m = prog.Net.init(seed=0)
    # CPython's fastest attribute read compares dict keys by identity with the code's interned names.
    assert all(key is sys.intern(key) for key in vars(m))
    assert m._m_handle is m.params()[0] and m.handle is not m._m_handle


def test_a_model_pickles_and_copies_with_its_live_tensors() -> None:
    m = ss.load(CLASHES, name="clash.ss").Net.init(seed=0)
    for again in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert type(again) is type(m) and again.params()[0] is again._leaf("handle")
        assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), m.state_dict().values()))


def test_an_optimizer_handle_keeps_its_number_private() -> None:
    stub = types.SimpleNamespace(_pool=None, devices="cpu[0 1]")
    opt = RemoteOptimizer(RemoteModel(stub, ss.load(LINEAR, name="fit.ss").Lin.spec, handle=1), "AdamW", {}, 2)
    assert "handle" not in vars(opt) and opt._handle == 2


@pytest.mark.slow
@pytest.mark.parametrize("devices", DEVICES)
def test_editing_a_field_read_from_python_never_changes_the_model(programs, devices: str) -> None:
    prog = programs[devices]
    m = prog.Net.init(seed=0)
    x = torch.randn(4, 3)
    before = prog.apply(m, x)
    w = m.handle
    assert not w.requires_grad
    w.mul_(0)  # a copy: neither raises (a leaf that requires grad would) nor reaches the model
    m.pool.add_(1.0)
    with torch.no_grad():
        m.handle.mul_(0)
        m.workers.zero_()
    assert torch.equal(prog.apply(m, x), before)
    assert torch.equal(m.state_dict()["handle"], programs["cpu"].Net.init(seed=0).handle)
    with pytest.raises(AttributeError, match="a model can't be changed from Python"):
        m.handle = torch.zeros(3, 3)
    assert torch.equal(prog.apply(m, x), before)


@pytest.mark.slow
def test_a_stale_handle_raises_at_once_without_starting_workers(tmp_path) -> None:
    prog = ss.load(LINEAR, devices="cpu[0 1]", name="fit.ss")
    try:
        m = prog.Lin.init(seed=0)
        opt = ss.adamw(m, lr=0.1)
        old = prog._pool
        prog.stop()
        calls = [lambda: prog.scores(m, torch.zeros(2, 4)), lambda: m.w, lambda: m.state_dict(),
                 lambda: ss.save(tmp_path / "c.safetensors", m, opt), lambda: ss.restore(tmp_path / "c.safetensors", m)]
        for call in calls:
            with pytest.raises(ss.WorkerError, match="make new models, or load a checkpoint"):
                call()
            assert prog._pool is None, "a new pool was started for a stale handle"
        assert not old.alive and list(tmp_path.iterdir()) == []
    finally:
        prog.stop()
