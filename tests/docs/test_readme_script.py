"""The README's Python script runs as it is, and the messages api.md quotes are the real ones."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from programs import readme_program
from support import ROOT

import shapescript as ss


def readme_script() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, "the README shows one complete Python script"
    return blocks[0]


def test_the_readme_script_runs_as_it_is(tmp_path, monkeypatch, capsys) -> None:
    """Saved next to the README's program as mlp.ss, the script runs with nothing defined beforehand
    (it once used an undefined `x, y`), trains (the loss falls) and prints its accuracy."""
    (tmp_path / "mlp.ss").write_text(readme_program())
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_script(), "README.md", "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out
    losses = [float(v) for v in re.findall(r"^epoch \d+  loss (\S+)$", printed, re.MULTILINE)]
    assert len(losses) == 3 and losses[-1] < losses[0], printed
    assert re.search(r"^training accuracy \d+\.\d\d%$", printed, re.MULTILINE), printed


def test_the_argument_error_api_md_quotes_is_what_the_runtime_raises() -> None:
    """api.md's example names the README program's location of `x` (13:20; it once said 16:20)."""
    quoted = re.search(r"`` (`x` of `forward` .*?) ``", (ROOT / "docs" / "api.md").read_text()).group(1)
    prog = ss.load(readme_program(), name="mlp.ss", devices="cpu")
    with pytest.raises(ss.ShapeError) as info:
        prog.forward(prog.Mlp.init(seed=0), torch.randn(32, 783))
    assert str(info.value).startswith(quoted), (str(info.value), quoted)


def api_python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "docs" / "api.md").read_text(), re.MULTILINE | re.DOTALL)


LINES = """\
dim V = 10
dim D = 4

data Line:
    tokens: [n] Index[V]
    targets: [n] Index[V]

model Bigram:
    param emb: [V D] = normal(std=0.02)
    param out: [D V] = normal(std=0.02)

fn loss(m: Bigram, batch: [b] Line) -> []:
    logits = embedding(m.emb, batch.tokens) @ m.out
    return cross_entropy(logits, batch.targets, over=V, mask=valid(batch, n))

fn fit(mut m: Bigram, mut opt: AdamW[Bigram], data: Dataset[Line], log: Sink):
    for batch in data |> batches(3):
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        write(log, logs(loss=l))
"""


def test_api_md_variable_length_dataset_feeds_a_padded_program() -> None:
    """api.md's class for examples of different lengths (what to write instead of a TensorDataset)
    loads: its one batch of 3 is padded, and the loss counts the real positions only, the same as
    the ss.Batch api.md shows made by hand with the lengths."""
    [block] = [b for b in api_python_blocks() if "class Lines" in b]
    space: dict = {}
    exec(compile(block, "api.md", "exec"), space)
    prog = ss.load(LINES, name="lines.ss", devices="cpu")
    m = prog.Bigram.init(seed=0)
    tokens = torch.tensor([[1, 2, 3], [5, 0, 0], [7, 8, 0]])
    targets = torch.tensor([[2, 3, 4], [6, 0, 0], [8, 9, 0]])
    by_hand = prog.loss(m, ss.Batch(prog.Line, {"tokens": tokens, "targets": targets},
                                    lengths={"n": torch.tensor([3, 1, 2])}))
    unpadded = prog.loss(m, {"tokens": tokens, "targets": targets})
    log = ss.sinks.memory()
    prog.fit(m, ss.adamw(m), space["data"], log)
    assert len(log.records) == 1
    assert log.records[0]["loss"] == pytest.approx(float(by_hand), abs=1e-6)
    assert float(unpadded) != pytest.approx(float(by_hand), abs=1e-6)  # the lengths matter


def test_api_md_standalone_build_runs_as_shown(tmp_path) -> None:
    """The command and script of api.md's standalone build, on the README's program saved as mlp.ss."""
    (tmp_path / "mlp.ss").write_text(readme_program())
    api = (ROOT / "docs" / "api.md").read_text()
    command = re.search(r"^shapescript (build --standalone .*)$", api, re.MULTILINE).group(1).split()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    built = subprocess.run([sys.executable, "-m", "shapescript.cli", *command], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    [block] = [b for b in api_python_blocks() if "mlp_standalone" in b]
    ran = subprocess.run([sys.executable, "-c", block + "\nprint('loss', float(loss))\n"], cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                         capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert re.fullmatch(r"loss \d+\.\d+\n", ran.stdout), ran.stdout


def test_api_md_sinks_table_shows_what_each_sink_writes(tmp_path, capsys) -> None:
    """The `step` each sink numbers its records with, as api.md's table shows it."""
    api = (ROOT / "docs" / "api.md").read_text()
    printed = re.search(r"^\| `ss\.sinks\.stdout\(\)` \| prints `(.*?)` \|$", api, re.MULTILINE).group(1)
    json_key = re.search(r"^\| `ss\.sinks\.jsonl\(path\)` \|.*?under the key `\"(\w+)\"`", api, re.MULTILINE).group(1)
    stdout, jsonl, memory = ss.sinks.stdout(), ss.sinks.jsonl(tmp_path / "log.jsonl"), ss.sinks.memory()
    for sink in (stdout, jsonl, memory):
        for _ in range(3):
            sink.write(ss.sinks.logs(loss=torch.tensor(2.3026)))
    jsonl.close()
    assert capsys.readouterr().out.splitlines()[2] == printed
    third = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[2])
    assert third[json_key] == 3 and third["loss"] == pytest.approx(2.3026)
    assert memory.records[2] == {"loss": pytest.approx(2.3026)}
