"""Every fenced block of README.md and docs/*.md says what it is, and is checked as that says.

A block's tag (its fence's info string) is one of TAGS; an untagged block, an unknown tag or an
indented code block fails. Then, per tag:

- `ss`, `ss-error CODE`, `ss-warning CODE`: compiled by test_docs.py (an `ss-build-error CODE` example, which fails
  only when built with --standalone, here; an `ss-no-python-error CODE` example, which fails only
  when checked with Python refused, here too).
- `python` and `sh`: run, each file's blocks in order in one namespace and one empty folder
  (tmp_path), as a reader would run them. A doc that says it works on the README's program saved
  as mlp.ss gets that file first (SETUP, keyed by the sentence that says so). docs/tutorial.md's
  and docs/sharp-bits.md's Python runs in test_tutorial.py and test_sharp_bits.py, which also check
  what those pages claim (RUN_ELSEWHERE; they have no sh blocks). docs/notebook.md's `python` and
  `ipython` (magics: `%load_ext`, `%%shapescript`) blocks are cells of one notebook, run in a real
  kernel with nbclient as tests/notebook/test_notebooks.py runs the example notebooks.
- An sh line that runs ShapeScript (`shapescript ...`, `python -m shapescript ...`) runs for real.
  The others can't run inside the suite: `make test` is the suite itself, `make demo` and `pip
  install` need the network and minutes. Each of those is checked against what it names instead:
  the make target exists in the Makefile, the extras exist in pyproject.toml's
  optional-dependencies, a pinned package has the pyproject's pin, a script or folder exists.
- `output`: what a command prints, compared with what it really prints (OUTPUTS).
- `text` (a URL; a usage synopsis, whose subcommands and flags must be the CLI's, both ways),
  `ebnf`, `markdown`, `lua`, `ts`, `json` (which must parse): not run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import nbformat
import pytest
import torch
from programs import readme_program
from support import ROOT

import shapescript as ss
from shapescript.cli import main as cli_main
from shapescript.codes import BUILD_ONLY, CODES, NO_PYTHON_ONLY
from shapescript.errors import CompileError
from shapescript.pipeline import check_source, python_module

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TAGS = {
    "ss": "a program that compiles (test_docs.py)",
    "ss-error": "a program that fails with exactly its code (test_docs.py)",
    "ss-build-error": "a program that fails with exactly its code when built --standalone",
    "ss-warning": "a program that compiles, warning of exactly its code (test_docs.py)",
    "ss-no-python-error": "a program that checks, and fails with exactly its code with Python refused",
    "python": "run, in order, in one namespace",
    "ipython": "a notebook cell with magics (docs/notebook.md only), run in a kernel",
    "sh": "shell commands: run, or checked against what they name",
    "output": "what a command prints: compared with what it prints",
    "text": "plain text: a URL, a usage synopsis (checked against the CLI)",
    "ebnf": "the grammar",
    "markdown": "Markdown to paste",
    "lua": "editor configuration",
    "ts": "editor configuration",
    "json": "editor configuration: parses",
}
WITH_CODE = {"ss-error", "ss-build-error", "ss-warning", "ss-no-python-error"}
NOTEBOOK_DOC = "notebook.md"
# (the tests that run them, under tests/)
RUN_ELSEWHERE = {"tutorial.md": "docs/test_tutorial.py", "sharp-bits.md": "docs/test_sharp_bits.py",
                 "architecture.md": "compiler/test_architecture.py"}  # it adds an op to the table: taken out again there
# Docs whose examples start from the README's program saved as mlp.ss, by the sentence saying so.
SETUP = {"README.md": "Saved as `mlp.ss`", "api.md": "program, saved as `mlp.ss` in the current folder",
         "ecosystem.md": "program, saved as `mlp.ss` in the current folder"}


@dataclass(frozen=True)
class Block:
    doc: str  # the file's name: README.md, api.md...
    line: int  # of the opening fence, 1-based
    tag: str
    argument: str  # what follows the tag: an error code
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line} ({self.tag or 'untagged'})"


def scan(path: Path) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a Markdown file, in order, and what is wrong with its code blocks: an
    unclosed fence, an indented fence, an indented code block (four spaces after a blank line)."""
    found: list[Block] = []
    wrong: list[str] = []
    lines = path.read_text().split("\n")
    k = 0
    while k < len(lines):
        line = lines[k]
        if re.match(r"\s+```", line):
            wrong.append(f"{path.name}:{k + 1}: an indented fence")
        elif line.startswith("    ") and k > 0 and lines[k - 1] == "":
            wrong.append(f"{path.name}:{k + 1}: an indented code block; fence it with a tag")
        elif line.startswith("```"):
            tag, _, argument = line[3:].strip().partition(" ")
            end = next((j for j in range(k + 1, len(lines)) if lines[j].startswith("```")), len(lines))
            if end == len(lines) or lines[end] != "```":
                wrong.append(f"{path.name}:{k + 1}: a fence not closed by a line ```")
            found.append(Block(path.name, k + 1, tag, argument, "\n".join(lines[k + 1:end]) + "\n"))
            k = end
        k += 1
    return found, wrong


def blocks_of(path: Path) -> list[Block]:
    return scan(path)[0]


def all_blocks() -> list[Block]:
    return [b for path in DOCS for b in blocks_of(path)]


def doc_blocks(doc: str) -> list[Block]:
    return [b for b in all_blocks() if b.doc == doc]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_block_is_tagged_with_a_known_tag(path: Path) -> None:
    blocks, wrong = scan(path)
    assert wrong == []
    for block in blocks:
        assert block.tag in TAGS, f"{block}: tag it with one of {sorted(TAGS)}"
        if block.tag in WITH_CODE:
            assert block.argument in CODES, f"{block}: {block.argument!r} is no error code"
            assert (block.argument in BUILD_ONLY) == (block.tag == "ss-build-error"), \
                f"{block}: {block.argument} fails {'only when built' if block.argument in BUILD_ONLY else 'in check'}"
            assert (block.argument in NO_PYTHON_ONLY) == (block.tag == "ss-no-python-error"), \
                f"{block}: {block.argument} fails {'only with Python refused' if block.argument in NO_PYTHON_ONLY else 'in check'}"
        else:
            assert block.argument == "", f"{block}: {block.argument!r} after the tag means nothing"
        assert block.tag != "ipython" or block.doc == NOTEBOOK_DOC, f"{block}: only {NOTEBOOK_DOC} runs notebook cells"


def test_the_tag_check_fails_on_what_it_must(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```python\nx = 1\n```\n\n```\nbare\n```\n")
    assert [(b.tag, b.text) for b in blocks_of(page)] == [("python", "x = 1\n"), ("", "bare\n")]
    with pytest.raises(AssertionError, match="tag it with one of"):
        test_every_block_is_tagged_with_a_known_tag(page)
    page.write_text("Text:\n\n    make demo\n\n```sh\nmake test\n")
    assert scan(page)[1] == ["page.md:3: an indented code block; fence it with a tag",
                             "page.md:5: a fence not closed by a line ```"]


def test_the_error_index_examples_are_tagged_with_their_codes() -> None:
    tagged = {b.argument for b in doc_blocks("errors.md") if b.tag in WITH_CODE}
    assert tagged == set(CODES)


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.tag == "ss-build-error"], ids=str)
def test_build_error_blocks_fail_with_their_code_when_built(block: Block) -> None:
    checked = check_source(block.text, "doc.ss")  # it checks...
    with pytest.raises(CompileError) as info:  # ...and fails to build
        python_module(checked, standalone=True)
    assert set(info.value.codes) == {block.argument}, str(info.value)


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.tag == "ss-no-python-error"], ids=str)
def test_no_python_error_blocks_check_and_fail_with_their_code_with_python_refused(block: Block) -> None:
    compile(python_module(check_source(block.text, "doc.ss")), "<doc>", "exec")  # it checks and builds...
    with pytest.raises(CompileError) as info:  # ...and is refused with Python refused
        check_source(block.text, "doc.ss", python=False)
    assert set(info.value.codes) == {block.argument}, str(info.value)


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.tag == "json"], ids=str)
def test_json_blocks_parse(block: Block) -> None:
    """A block may be the members of an object (package.json's keys to add), without its braces."""
    text = block.text.strip()
    json.loads(text if text.startswith(("{", "[")) else "{" + text + "}")


def test_the_grammar_names_tokens_the_language_has() -> None:
    """The grammar's quoted terminals: its symbols are the lexer's, and each word is one that the
    docs' programs use (the lexer's keywords, or a word such as `model` that the parser reads)."""
    from shapescript.syntax.lexer import KEYWORDS, PUNCT
    [grammar] = [b for b in all_blocks() if b.tag == "ebnf"]
    terminals = set(re.findall(r'"([^"]+)"', grammar.text))
    words = {t for t in terminals if t.isidentifier()}
    assert terminals - words <= set(PUNCT), terminals - words - set(PUNCT)
    programs = " ".join(b.text for b in all_blocks() if b.tag in ("ss", *WITH_CODE))
    unknown = words - KEYWORDS - set(re.findall(r"\w+", programs))
    assert unknown == set(), unknown


# ---- output: what commands print ----------------------------------------------------------------

def readme_mistake() -> str:
    """The README's program with its mistake: the second layer multiplied by w1 again."""
    program = readme_program()
    mistaken = program.replace("relu(x @ m.w1) @ m.w2", "relu(x @ m.w1) @ m.w1")
    assert mistaken != program
    return mistaken


def compiler_prints() -> str:
    with pytest.raises(CompileError) as info:
        check_source(readme_mistake(), "mlp.ss")
    return str(info.value) + "\n"


def editor_shows() -> str:
    from shapescript.lsp import message_of
    with pytest.raises(CompileError) as info:
        check_source(readme_mistake(), "mlp.ss")
    [diagnostic] = info.value.diagnostics
    return message_of(diagnostic) + "\n"


def notebook_shows() -> str:
    """notebook.md's two %%shapescript cells of the README's program, the second with the README's
    mistake: the diagnostics the cell shows, then IPython's line for the exception."""
    from shapescript.notebook.cells import Cell
    from shapescript.notebook.report import CellCompileError
    from shapescript.notebook.session import Session
    first, second = [b.text for b in doc_blocks(NOTEBOOK_DOC) if b.text.startswith("%%shapescript\n")][:2]
    session = Session({})
    session.run_cell(Cell("cell [1]", first, first_line=2))
    mistaken = second.replace("relu(x @ m.w1) @ m.w2", "relu(x @ m.w1) @ m.w1")
    assert mistaken != second
    with pytest.raises(CellCompileError) as info:
        session.run_cell(Cell("cell [2]", mistaken, first_line=2))
    return info.value.rendered + "\n" + "\n".join(info.value._render_traceback_()) + "\n"


def notebook_runtime_error_shows() -> str:
    """notebook.md's `forward` called with 780 features instead of 784: what the kernel shows."""
    from shapescript.errors import ShapeError
    from shapescript.notebook.cells import Cell
    from shapescript.notebook.session import Session
    first, second = [b.text for b in doc_blocks(NOTEBOOK_DOC) if b.text.startswith("%%shapescript\n")][:2]
    ns: dict = {}
    session = Session(ns)
    session.run_cell(Cell("cell [1]", first, first_line=2))
    session.run_cell(Cell("cell [2]", second, first_line=2))
    with pytest.raises(ShapeError) as info:
        ns["forward"](ns["Mlp"].init(seed=0), torch.randn(32, 780))
    return "\n".join(session.error_lines(info.value)) + "\n"


OUTPUTS: dict[str, list[Callable[[], str]]] = {
    "README.md": [compiler_prints],
    "editor.md": [editor_shows],
    "notebook.md": [notebook_shows, notebook_runtime_error_shows],
}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_output_blocks_are_what_is_printed(path: Path) -> None:
    shown = [b for b in blocks_of(path) if b.tag == "output"]
    makers = OUTPUTS.get(path.name, [])
    assert len(shown) == len(makers), f"{path.name}: each `output` block needs its maker in OUTPUTS"
    for block, make in zip(shown, makers):
        assert block.text == make(), f"{block} differs from what {make.__name__} gives"


# ---- text: the command line's synopsis ----------------------------------------------------------

def cli_help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        cli_main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def flags_in(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", text))


def accepted_options(help_text: str) -> list[set[str]]:
    """Each option of a --help, as the set of its spellings (`-o`, `--output`), -h/--help aside."""
    listed = help_text.split("options:", 1)[1]
    options = [flags_in(line.split("  ", 2)[1]) for line in listed.splitlines() if line.startswith("  -")]
    return [o for o in options if o != {"-h", "--help"}]


def test_the_usage_synopsis_is_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """api.md's synopsis names each subcommand of the CLI and, for each, every option its argparse
    takes (in one of its spellings) and no other."""
    synopses = [b for b in all_blocks() if b.tag == "text" and b.text.startswith("shapescript ")]
    assert [b.doc for b in synopses] == ["api.md"]
    shown = {line.split()[1]: flags_in(line.split("#")[0]) for line in synopses[0].text.splitlines()}
    commands = re.search(r"\{([\w,]+)\}", cli_help(capsys)).group(1).split(",")
    assert sorted(shown) == sorted(commands)
    for command, flags in shown.items():
        options = accepted_options(cli_help(capsys, command))
        assert all(any(flag in o for o in options) for flag in flags), (command, flags, options)
        assert all(o & flags for o in options), (command, flags, options)


# ---- sh: commands -------------------------------------------------------------------------------

PYTHONS = {"python", "python3", ".venv/bin/python"}


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):(?!=)", (ROOT / "Makefile").read_text(), re.MULTILINE))


def check_extras(line: str) -> None:
    """Every `.[a,b]` or `shapescript[a,b]` on the line, its comment included, names extras that
    pyproject.toml has."""
    extras = pyproject()["optional-dependencies"]
    for named in re.findall(r"(?:\.|\bshapescript)\[([\w,-]+)\]", line):
        assert set(named.split(",")) <= set(extras), f"{line!r}: no such extra in pyproject.toml"


def check_pip_install(words: list[str], line: str) -> None:
    """An install can't run offline: what it names must be what pyproject.toml declares."""
    project = pyproject()
    declared = [*project["dependencies"], *(d for ds in project["optional-dependencies"].values() for d in ds)]
    pins = dict(re.match(r"([\w.-]+)(?:\[[\w,-]+\])?\s*==\s*(\S+)", d).groups() for d in declared if "==" in d)
    names = {re.match(r"[\w.-]+", d).group(0).lower() for d in declared}
    check_extras(line)
    k = 0
    while k < len(words):
        word = words[k]
        if word in ("--index-url", "--extra-index-url"):
            assert words[k + 1].startswith("https://download.pytorch.org/whl/"), line
            k += 1
        elif word.startswith((".[", "shapescript[")):  # the checkout or the package, with extras: checked above
            pass
        elif "==" in word:
            name, version = word.split("==")
            assert pins.get(name) == version, f"{line!r}: pyproject.toml pins {name} to {pins.get(name)}"
        elif not word.startswith("-"):
            assert word.lower() in names, f"{line!r}: {word} is none of pyproject.toml's dependencies"
        k += 1


def check_script(script: str, args: list[str], line: str) -> None:
    """A demo or a benchmark takes minutes, and its own tests run it: here it exists and its argparse
    declares each flag the line gives it."""
    assert (ROOT / script).is_file(), f"{line!r}: no such script"
    declared = set(re.findall(r"add_argument\(\s*\"(--?[\w-]+)\"", (ROOT / script).read_text()))
    for flag in (a for a in args if a.startswith("-")):
        assert flag in declared, f"{line!r}: {script} takes no {flag}"


def run_shapescript(args: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "shapescript", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)  # `lsp` ends at its input's end
    assert done.returncode == 0, f"shapescript {' '.join(args)}: {done.stderr}"


def run_sh_line(line: str, cwd: Path) -> None:
    """One command of an sh block: run when it is ShapeScript's, else checked against what it names."""
    words = shlex.split(line, comments=True)
    if not words:
        return
    if words[0] == "shapescript":
        run_shapescript(words[1:], cwd)
    elif words[0] in PYTHONS and words[1:3] == ["-m", "shapescript"]:
        run_shapescript(words[3:], cwd)
    elif words[0] == "make":
        assert set(words[1:]) <= make_targets(), f"{line!r}: no such target in the Makefile"
        check_extras(line)
    elif "pip" in words[:3] and "install" in words:
        check_pip_install(words[words.index("install") + 1:], line)
    elif words[0] in PYTHONS and words[1:3] == ["-m", "venv"]:
        assert words[3] == re.search(r"^VENV \?= (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1), line
    elif words[0] in PYTHONS and words[1].endswith(".py"):  # a repository's script: a demo, a benchmark
        check_script(words[1], words[2:], line)
    elif words[:2] == ["jupyter", "lab"]:
        assert (ROOT / words[2]).is_dir(), f"{line!r}: no such folder"
    else:
        raise AssertionError(f"{line!r}: no way to run or check this command; add one to run_sh_line")


def test_sh_checks_fail_on_what_drifted(tmp_path: Path) -> None:
    for wrong in ("make demos", "pip install -e '.[notebooks]'", "pip install torch==2.0.0",
                  "pip install 'shapescript[editors]'", "python3 -m venv env", "python examples/digits/training.py",
                  "python benchmarks/step.py --fast", "rm -rf build",
                  "shapescript check missing.ss"):
        with pytest.raises(AssertionError):
            run_sh_line(wrong, tmp_path)


# ---- python and sh: each doc run as a reader runs it --------------------------------------------

def runnable_docs() -> list[str]:
    docs = [path.name for path in DOCS if any(b.tag in ("python", "sh") for b in blocks_of(path))]
    return [d for d in docs if d not in RUN_ELSEWHERE and d != NOTEBOOK_DOC]


def test_every_doc_with_python_or_sh_is_run() -> None:
    """The docs run elsewhere have only Python blocks, and their tests run each of those blocks."""
    for doc, test in RUN_ELSEWHERE.items():
        assert {b.tag for b in doc_blocks(doc)} & {"sh", "ipython"} == set(), doc
        source = (ROOT / "tests" / test).read_text()
        assert f'"{doc}"' in source and "exec(compile(" in source and r"^```python\n" in source, test
    assert set(runnable_docs()) == {"README.md", "api.md", "benchmarks.md", "ecosystem.md", "editor.md"}


@pytest.mark.parametrize("doc", runnable_docs())
def test_python_and_sh_blocks_run_in_order(doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # a module a block builds imports, as from `python` there
    modules_before = set(sys.modules)
    if doc in SETUP:
        page = (ROOT / "README.md" if doc == "README.md" else ROOT / "docs" / doc).read_text()
        assert " ".join(SETUP[doc].split()) in " ".join(page.split()), f"{doc} no longer says {SETUP[doc]!r}"
        (tmp_path / "mlp.ss").write_text(readme_program())
    namespace: dict = {"__name__": "__main__"}
    try:
        for block in doc_blocks(doc):
            if block.tag == "python":
                exec(compile(block.text, str(block), "exec"), namespace)
            elif block.tag == "sh":
                for line in block.text.splitlines():
                    run_sh_line(line, tmp_path)
        CLAIMS.get(doc, lambda _: None)(namespace)
    finally:
        for name in set(sys.modules) - modules_before:  # a module built here, as mlp_standalone
            if str(tmp_path) in str(getattr(sys.modules[name], "__file__", "") or ""):
                del sys.modules[name]


def api_claims(namespace: dict) -> None:
    """What api.md's comments say: a dim sized by `dims`; the standalone module's model of seed 0 is
    `load`'s, so its step's loss is the loaded program's loss on the same batch."""
    assert namespace["lm"].twice(torch.ones(65)).tolist() == [2.0] * 65
    prog = ss.load("mlp.ss", devices="cpu")
    x, y = namespace["x"], namespace["y"]
    expected = prog.loss(prog.Mlp.init(seed=0), {"img": x, "label": y})
    assert float(namespace["loss"]) == pytest.approx(float(expected), abs=1e-6)


def readme_claims(namespace: dict) -> None:
    assert 0.0 <= float(namespace["accuracy"]) <= 1.0


CLAIMS: dict[str, Callable[[dict], None]] = {"api.md": api_claims, "README.md": readme_claims}


# ---- notebook.md: its cells as one notebook, in a kernel ----------------------------------------

def notebook_runner() -> ModuleType:  # tests/notebook/test_notebooks.py, by path: tests/notebook isn't a package
    spec = importlib.util.spec_from_file_location("notebook_runs", ROOT / "tests" / "notebook" / "test_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The test's own last cell: facts the doc's cells claim, printed for the test to read.
FACTS_CELL = """import json
print(json.dumps({"records": len(log.records), "remote": m.is_remote, "devices": str(ss_program.devices),
                  "last": log.records[-1]["loss"]}))"""


@pytest.mark.slow
def test_notebook_md_runs_as_a_notebook(tmp_path: Path) -> None:
    """Its python and ipython blocks, in order, as the cells of one notebook run by nbclient in a
    fresh kernel (on two CPU workers from its devices cell on), then a cell of the test's own."""
    runner = notebook_runner()
    cells = [b.text.rstrip("\n") for b in doc_blocks(NOTEBOOK_DOC) if b.tag in ("python", "ipython")]
    assert cells[0] == "%load_ext shapescript"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in [*cells, FACTS_CELL]]
    path = tmp_path / "notebook" / "notebook_md.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    ran = runner.execute(path, runner.python3_kernel(tmp_path / "kernelspec"))
    shown = [runner.shown(cell) for cell in ran.cells]
    facts = json.loads(shown[-1])
    assert facts["devices"] == "cpu[0 1]" and facts["remote"]
    assert facts["records"] == 10  # 640 examples in batches of 64
    by_cell = dict(zip(cells, shown))
    [predicted] = [text for cell, text in by_cell.items() if cell.endswith("predict(m, x).argmax(1)")]
    assert predicted.startswith("tensor([") and len(re.findall(r"\d+", predicted)) == 32, predicted
    [printed] = [text for cell, text in by_cell.items() if "progress.bars()" in cell]
    assert re.findall(r"^step (\d+)  loss=", printed, re.MULTILINE) == [str(k) for k in range(1, 11)], printed
    [barred] = [text for cell, text in by_cell.items() if "run(m, opt, data, ss.sinks.memory())" in cell]
    assert "/10 " in barred, barred  # its comment: a bar that counts the 10 batches
    [live] = [text for cell, text in by_cell.items() if cell.endswith('log.records[-1]["loss"]')]
    assert "/10 " in live and "live charts" in live, live  # its comment: a progress bar, then the charts
    assert float(live.splitlines()[-1]) == pytest.approx(facts["last"])
