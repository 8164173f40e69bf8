"""docs/tutorial.md runs: its ```python blocks, in order, in one namespace, in an empty folder,
and what the tutorial says of the results holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from support import ROOT

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def tutorial_blocks() -> list[str]:
    return PYTHON_BLOCK.findall((ROOT / "docs" / "tutorial.md").read_text())


def test_the_tutorial_runs_and_its_claims_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = tutorial_blocks()
    assert len(blocks) >= 7
    namespace: dict = {"__name__": "tutorial"}
    for k, block in enumerate(blocks):
        exec(compile(block, f"docs/tutorial.md python block {k}", "exec"), namespace)
    ss = namespace["ss"]
    assert namespace["scores"].shape == torch.Size([5, 10])
    assert (tmp_path / "first.ss").exists() and (tmp_path / "first.safetensors").exists()
    # Held-out accuracy, recomputed by hand in PyTorch from the model's params.
    m, images, labels, test = namespace["m"], namespace["images"], namespace["labels"], namespace["test"]
    by_hand = ((torch.relu(images[test] @ m.w1) @ m.w2).argmax(-1) == labels[test]).float().mean().item()
    assert namespace["held_out"] == pytest.approx(by_hand, abs=1e-6)
    assert namespace["held_out"] > 0.9
    # The restored model is the saved one: same params, same accuracy.
    fresh = namespace["fresh"]
    assert torch.equal(fresh.w1, m.w1) and torch.equal(fresh.w2, m.w2)
    assert float(namespace["prog"].accuracy(fresh, namespace["test_batch"])) == namespace["held_out"]
    # Two devices train as one: a loss per step, equal within 1e-5.
    one, two = namespace["one"], namespace["two"]
    assert len(one) == len(two) == 24  # 1,500 examples in batches of 64
    assert max(abs(a - b) for a, b in zip(one, two)) < 1e-5
    assert isinstance(ss.ShapeError, type)
    # A real training run: the best held-out loss is below the first, and the checkpoint of the best
    # epoch restores the model and the optimizer's position (72 updates, the last epoch's).
    assert namespace["best"] < namespace["first_held_out"] - 0.5
    assert namespace["adamw"].steps == 72 and namespace["again"].steps == namespace["adamw"].steps
    assert float(namespace["real"].loss(namespace["resumed"], namespace["test_batch"])) == namespace["best"]


def test_the_shape_error_shown_is_the_one_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comment under the tutorial's wrong call shows what the error says."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "tutorial"}
    blocks = tutorial_blocks()
    for block in blocks[:2]:
        exec(block, namespace)
    shown = re.search(r"print\(e\)  # (.*)", blocks[2]).group(1)
    before, after = shown.split("...")
    with pytest.raises(namespace["ss"].ShapeError) as info:
        namespace["prog"].forward(namespace["m"], torch.randn(5, 63))
    assert before in str(info.value) and after in str(info.value), str(info.value)
