"""Every `ss` block in README.md and docs/ compiles, warning of nothing; every `ss-error CODE` block fails with
exactly that code, every `ss-warning CODE` block compiles warning of exactly that code."""

from __future__ import annotations

import re

import pytest
from programs import README, readme_program
from support import ROOT

from shapescript.errors import CompileError
from shapescript.pipeline import check_source, python_module

BLOCK = re.compile(r"^```(ss(?:-error (E\d{4})|-warning (W\d{4}))?)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks() -> list:
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for k, m in enumerate(BLOCK.finditer(path.read_text())):
            out.append(pytest.param(m.group(4), m.group(2) or m.group(3), id=f"{path.stem}-{k}"))
    return out


@pytest.mark.parametrize("source, code", blocks())
def test_doc_block(source: str, code: str | None) -> None:
    if code is None or code.startswith("W"):  # a warning's example compiles, warning of its code
        checked = check_source(source, "doc.ss")
        compile(python_module(checked), "<doc>", "exec")
        assert {w.code for w in checked.warnings} == ({code} if code else set())
    else:
        with pytest.raises(CompileError) as info:
            check_source(source, "doc.ss")
        assert set(info.value.codes) == {code}, str(info.value)


def test_docs_have_blocks() -> None:
    assert len(blocks()) >= 12


def test_the_readme_error_is_what_the_compiler_prints() -> None:
    """Of the README's own program, so that the line numbers shown are its lines (once 17 for 14)."""
    readme = (ROOT / "README.md").read_text()
    shown = readme.split("A mistake is caught before anything runs:\n\n```output\n")[1].split("```")[0]
    program = readme_program()
    assert program in README  # what test_readme_mlp runs
    source = program.replace("relu(x @ m.w1) @ m.w2", "relu(x @ m.w1) @ m.w1")
    assert source != program
    with pytest.raises(CompileError) as info:
        check_source(source, "mlp.ss")
    assert str(info.value) + "\n" == shown
