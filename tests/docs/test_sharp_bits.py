"""docs/sharp-bits.md's Python blocks run, in order, in one namespace, as a reader would run them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import ROOT

PAGE = ROOT / "docs" / "sharp-bits.md"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)


def test_the_page_has_python_blocks() -> None:
    assert len(python_blocks()) >= 5


def test_python_blocks_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "sharp_bits"}
    try:
        for number, block in enumerate(python_blocks()):
            exec(compile(block, f"{PAGE.name} python block {number}", "exec"), namespace)
    finally:
        for name in ("prog", "prog2", "small"):  # stop any workers a failed block left running
            if name in namespace:
                namespace[name].stop()
