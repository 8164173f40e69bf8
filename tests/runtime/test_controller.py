"""Controller-side functions: loops over datasets, logs and sinks, checkpoints, loading checks."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from programs import LIN_HEADER, LIN_LOSS, LIN_STEP

import shapescript as ss

PROGRAM = LIN_HEADER + "\n" + LIN_LOSS + "\n" + LIN_STEP + textwrap.dedent("""\

    fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink, path: str):
        for batch in data |> shuffle(seed=1) |> batches(8):
            l = step(mut m, mut opt, batch)
            write(log, logs(loss=l, size=batch.x))
        save(path, m, opt)
        print("saved", path)

    fn resume(mut m: Lin, mut opt: AdamW[Lin], path: str):
        load(path, mut m, mut opt)

    fn evaluate(m: Lin, data: Dataset[Ex]) -> []:
        total = to(0.0, f32)
        for batch in data |> batches(16):
            total = total + loss(m, batch)
        return total
    """)


def tensors(n: int = 20, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 4, generator=g), "y": torch.randint(0, 3, (n,), generator=g)}


class ListDataset:
    """A plain map-style dataset of dict items, without __getitems__."""

    def __init__(self, fields: dict[str, torch.Tensor], bad: dict[int, dict] | None = None) -> None:
        self.fields = fields
        self.bad = bad or {}

    def __len__(self) -> int:
        return len(self.fields["x"])

    def __getitem__(self, i: int) -> dict:
        if i in self.bad:
            return self.bad[i]
        return {"x": self.fields["x"][i].tolist(), "y": int(self.fields["y"][i])}


class BatchedDataset(ListDataset):
    """PyTorch's batch protocol: __getitems__ returns a dict of stacked fields."""

    def __init__(self, fields: dict[str, torch.Tensor]) -> None:
        super().__init__(fields)
        self.batch_calls = 0

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        self.batch_calls += 1
        idx = torch.tensor(indices)
        return {"x": self.fields["x"][idx], "y": self.fields["y"][idx]}


@pytest.fixture()
def prog():
    return ss.load(PROGRAM, name="fit.ss")


def fit_losses(prog, data, tmp_path) -> tuple[list[float], ss.Model]:
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    sink = ss.sinks.memory()
    prog.fit(m, opt, data, sink, str(tmp_path / "ck.safetensors"))
    return [r["loss"] for r in sink.records], m


def test_every_kind_of_dataset_gives_the_same_training(prog, tmp_path, capsys) -> None:
    fields = tensors()
    a, ma = fit_losses(prog, ss.TensorDataset(**fields), tmp_path)
    b, mb = fit_losses(prog, ListDataset(fields), tmp_path)
    batched = BatchedDataset(fields)
    c, mc = fit_losses(prog, batched, tmp_path)
    assert len(a) == 3 and a == b == c  # 8 + 8 + 4
    assert batched.batch_calls == 3
    assert torch.equal(ma.w, mb.w) and torch.equal(ma.w, mc.w)
    assert capsys.readouterr().out.count("saved ") == 3
    # the same loop by hand
    w = prog.Lin.init(seed=0).w.detach().clone().requires_grad_()
    opt = torch.optim.AdamW([w], lr=0.1)
    order = torch.randperm(20, generator=torch.Generator().manual_seed(1))
    for k in range(3):
        idx = order[8 * k: 8 * k + 8]
        loss = torch.nn.functional.cross_entropy(fields["x"][idx] @ w, fields["y"][idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        assert a[k] == pytest.approx(loss.item(), abs=1e-6)


def test_checkpoint_written_by_the_program_resumes_training(prog, tmp_path) -> None:
    fields = tensors()
    _, m = fit_losses(prog, ss.TensorDataset(**fields), tmp_path)
    m2 = prog.Lin.init(seed=9)
    opt2 = ss.adamw(m2, lr=0.1)
    prog.resume(m2, opt2, str(tmp_path / "ck.safetensors"))
    assert torch.equal(m2.w, m.w)
    assert float(prog.evaluate(m2, ss.TensorDataset(**fields))) == pytest.approx(
        float(prog.evaluate(m, ss.TensorDataset(**fields))))


def test_jsonl_sink_and_vector_logs(prog, tmp_path) -> None:
    path = tmp_path / "log.jsonl"
    with ss.sinks.jsonl(path) as sink:
        m = prog.Lin.init(seed=0)
        prog.fit(m, ss.adamw(m), ss.TensorDataset(**tensors()), sink, str(tmp_path / "c.safetensors"))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert len(rows[0]["size"]) == 8 and len(rows[2]["size"]) == 4


def test_a_bad_item_names_its_index_field_and_declaration(prog, tmp_path) -> None:
    fields = tensors()
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    bad = ListDataset(fields, bad={13: {"x": [0.0, 1.0, 2.0], "y": 1}})
    with pytest.raises(ss.ShapeError) as info:
        prog.fit(m, opt, bad, ss.sinks.memory(), str(tmp_path / "x.safetensors"))
    text = str(info.value)
    assert "item 13" in text and "field `x`" in text and "expected [D] with D = 4" in text
    assert "fit.ss:5:5" in text
    worse = ListDataset(fields, bad={2: {"x": [0.0] * 4, "y": 7}})
    with pytest.raises(ss.DomainError, match="item 2 of the dataset: field `y` is 7, outside Index\\[C\\] with C = 3"):
        m = prog.Lin.init(seed=0)
        prog.fit(m, ss.adamw(m), worse, ss.sinks.memory(), str(tmp_path / "y.safetensors"))
