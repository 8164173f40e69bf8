"""Sinks: stdout lines, JSON lines flushed each write, memory records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from support import ROOT

from shapescript.runtime.sinks import Logs, jsonl, logs, memory, stdout, write


def test_stdout_lines(capsys: pytest.CaptureFixture[str]) -> None:
    sink = stdout()
    write(sink, logs(loss=torch.tensor(2.302585)))
    write(sink, logs(loss=0.5, acc=torch.tensor(0.875), lr=1e-5, epoch=3))
    write(sink, logs(w=torch.tensor([1.0, 2.5])))
    assert capsys.readouterr().out.splitlines() == [
        "step 1  loss=2.3026",
        "step 2  loss=0.5000  acc=0.8750  lr=1.0000e-05  epoch=3",
        "step 3  w=[1.0000, 2.5000]",
    ]


def test_jsonl_is_flushed_each_write(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    with jsonl(path) as sink:
        write(sink, logs(loss=torch.tensor(2.5), n=np.int64(4)))
        assert json.loads(path.read_text()) == {"step": 1, "loss": 2.5, "n": 4}  # before close
        write(sink, logs(loss=1.25, grads=torch.tensor([[1, 2]])))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [{"step": 1, "loss": 2.5, "n": 4},
                     {"step": 2, "loss": 1.25, "grads": [[1, 2]]}]
    with pytest.raises(ValueError, match="closed"):
        write(sink, logs(loss=1.0))


def test_jsonl_replaces_an_existing_file_as_the_docs_say(tmp_path: Path) -> None:
    """The file is new for each sink: an older run's lines are gone as soon as the sink is made, not
    appended to, and docs/api.md's table says so."""
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 1, "loss": 9.0}\n{"step": 2, "loss": 8.0}\n')
    with jsonl(path) as sink:
        assert path.read_text() == ""  # replaced when made, before any record
        write(sink, logs(loss=1.5))
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 1, "loss": 1.5}]
    row = next(line for line in (ROOT / "docs" / "api.md").read_text().splitlines()
               if line.startswith("| `ss.sinks.jsonl(path)`"))
    assert "an existing one is replaced" in row


def test_memory_keeps_plain_values() -> None:
    sink = memory()
    write(sink, logs(loss=torch.tensor(0.25, requires_grad=True) * 2))
    write(sink, Logs(loss=1, name="eval"))
    assert sink.records == [{"loss": 0.5}, {"loss": 1, "name": "eval"}]
    assert isinstance(sink.records[0]["loss"], float)


def test_values_that_cannot_be_logged() -> None:
    with pytest.raises(TypeError, match="`model` has type object, expected a number or tensor"):
        write(memory(), logs(model=object()))
