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
doesn't set it). The install takes half as long.
"""

from __future__ import annotations

import ast
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from support import ROOT
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
PIP_TIMEOUT = 1800  # seconds: in CI pip downloads PyTorch's CPU wheel (about 200 MB) and the rest


def repository_copy(dest: Path) -> Path:
    """The files a clone of this checkout would have, with the changes not yet committed: the
    tracked files still present and the untracked ones git doesn't ignore."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything but the usual litter
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"))
        return dest
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def reachable(host: str, port: int = 443, seconds: float = 5.0) -> bool:
    try:
        socket.create_connection((host, port), timeout=seconds).close()
        return True
    except OSError:
        return False


def clean_env(venv: Path) -> dict[str, str]:
    """The environment Binder's build and kernel have: the new environment first on PATH, and
    nothing of this test run's (no PYTHONPATH to this checkout, no active virtualenv, bytecode
    written as Python writes it by default)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_NO_INPUT"] = "1"
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = PIP_TIMEOUT) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"{' '.join(cmd)} exited with {done.returncode}:\n"
                                  f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


@pytest.mark.slow
def test_the_notebooks_run_in_what_binder_builds(tmp_path: Path) -> None:
    repo = repository_copy(tmp_path / "repo")
    assert (repo / "binder" / "requirements.txt").is_file() and (repo / "notebooks").is_dir()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = clean_env(venv)
    if not reachable("download.pytorch.org"):
        env["PIP_RETRIES"] = "0"

    # As repo2docker: from the repository's root, then postBuild (executable, run from the root).
    run([python, "-m", "pip", "install", "--no-cache-dir", "--no-compile", "-r", "binder/requirements.txt"], repo, env)
    post_build = repo / "binder" / "postBuild"
    if post_build.exists():
        run(["bash", str(post_build)], repo, env)

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
