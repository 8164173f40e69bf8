"""binder/: what mybinder.org builds for the notebooks, installed as Binder installs it, and the
notebooks run on the result.

repo2docker copies the repository, then runs `pip install --no-cache-dir -r binder/requirements.txt`
from its root (so `.` in that file is the repository), then `binder/postBuild` if there is one.
This test does the same in a fresh virtual environment, on a copy of the files a clone would have
(the install writes build/ and *.egg-info into the tree it builds). It registers nothing outside its
temporary folder: the notebooks run on a kernelspec of the new environment's python written there.

What it checks: the install takes PyTorch's CPU build (`+cpu`, no nvidia packages), the package
comes from the new environment, every notebook's imports are there, and two notebooks (RUN_HERE) run
to the end there.

Where download.pytorch.org can't be reached (a sandbox; pip then finds torch 2.13.0+cpu in its
local find-links), pip is told not to retry it, or each package's lookup would wait for pip's
retries: a minute's install becomes seven. It changes nothing pip chooses. Nor does
`--no-compile`: pip leaves the bytecode of every installed file (most of it torch's, which the
notebooks import a small part of) to the first import, which writes it for the processes after
it (PYTHONDONTWRITEBYTECODE, which our machines set, is left out of the environment, as Binder
doesn't set it). The install takes half as long. It is tests/notebook/binder_build.py's, which
the suite starts in the background when the compiler's tests start (tests/conftest.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from binder_build import BUILD, BinderBuild, run
from test_notebooks import all_shown, check_ran_cleanly, execute, python3_kernel

# A line each notebook prints near its end (test_notebooks.py checks the numbers in them).
LAST_WORDS = {"01_tour.ipynb": "held-out accuracy: ", "02_several_devices.ipynb": "same params: True",
              "03_attention.ipynb": "held-out loss after ", "04_training.ipynb": "and the same step: True",
              "05_nanogpt.ipynb": "the same samples again: True"}
# The notebook run here, in the new environment: the one that starts workers, whose processes come
# from this environment's python. All five run in test_notebooks.py on the same package; here each
# one's imports are checked instead, which is what the environment adds. (Running the tour here too
# took 10 s of the suite's 2 cores, all four about a minute.)
RUN_HERE = ("02_several_devices.ipynb",)


@pytest.mark.slow
def test_the_notebooks_run_in_what_binder_builds(tmp_path: Path) -> None:
    build = BUILD.wait()  # started when the compiler's tests did (tests/conftest.py), or now
    try:
        ran_in(build, tmp_path)
    finally:
        build.remove()


def ran_in(build: BinderBuild, tmp_path: Path) -> None:
    repo, venv, env = build.repo, build.venv, build.env
    python = str(venv / "bin" / "python")
    assert (repo / "binder" / "requirements.txt").is_file() and (repo / "notebooks").is_dir()
    found = run([python, "-c", "import shapescript, torch; print(torch.__version__); print(shapescript.__file__)"],
                tmp_path, env).split()
    assert found[0] == "2.13.0+cpu", found
    assert Path(found[1]).is_relative_to(venv), f"shapescript imported from {found[1]}, not the new environment"
    packages = run([python, "-m", "pip", "list", "--format=freeze"], tmp_path, env)
    assert not [p for p in packages.splitlines() if p.lower().startswith("nvidia")], packages

    notebooks = sorted((repo / "notebooks").glob("*.ipynb"))
    assert {p.name for p in notebooks} >= set(LAST_WORDS)
    own = {p.stem for p in (repo / "examples").rglob("*.py")}  # the notebooks put these on sys.path themselves
    modules = sorted(set().union(*(python_imports(path) for path in notebooks)) - own)
    assert "shapescript" in modules and "torch" in modules, modules
    run([python, "-c", f"import {', '.join(modules)}"], repo / "notebooks", env)
    for name in RUN_HERE:
        path = repo / "notebooks" / name
        km = python3_kernel(tmp_path / f"kernel-{path.stem}", python=python, pythonpath=None)
        nb = execute(path, km, env=env)
        check_ran_cleanly(nb)
        assert LAST_WORDS[name] in all_shown(nb), name


def python_imports(path: Path) -> set[str]:
    """The top-level modules a notebook's Python cells import (its `%%shapescript` cells and `%`/`!`
    lines aside)."""
    found: set[str] = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code" or cell.source.startswith("%%"):
            continue
        lines = [line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found
