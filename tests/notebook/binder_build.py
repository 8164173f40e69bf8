"""The Binder build of tests/notebook/test_binder.py, which can start before its test runs.

The build is a fresh virtual environment and repo2docker's `pip install -r binder/requirements.txt`
in a copy of the repository: about 25 s of one core, most of it pip unpacking wheels. The rest of the
suite leaves a core idle much of the time; tests/conftest.py starts the build in a thread of its own
when the compiler's tests start (one process, one core, for a minute), and the test waits for it.
Run alone, the test starts it itself. Either way the build is the same: only when it starts differs.

Its folder is made by tempfile.mkdtemp (new, ours alone) and removed by `remove` (the test's end)
or by `stop` (the session's end: a build the test never took, or an interrupted one, its pip killed).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from support import ROOT

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


class BinderBuild:
    """The build, in a thread: `start` (once; later calls do nothing), then `wait` for its folder."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._pip: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self.env: dict[str, str] = {}  # the build's and the kernel's environment, set as the build starts

    @property
    def repo(self) -> Path:
        assert self.folder is not None
        return self.folder / "repo"

    @property
    def venv(self) -> Path:
        assert self.folder is not None
        return self.folder / "venv"

    def _environment(self) -> dict[str, str]:
        env = clean_env(self.venv)
        if not reachable("download.pytorch.org"):
            # a sandbox: pip finds torch 2.13.0+cpu in its local find-links, and each package's lookup
            # on the unreachable index would otherwise wait for pip's retries (a minute becomes seven)
            env["PIP_RETRIES"] = "0"
        return env

    def start(self) -> None:
        if self._thread is None:
            self.folder = Path(tempfile.mkdtemp(prefix="binder-build-"))
            self._thread = threading.Thread(target=self._build, name="binder build", daemon=True)
            self._thread.start()

    def wait(self) -> BinderBuild:
        self.start()
        assert self._thread is not None
        self._thread.join()
        if self._failure is not None:
            raise self._failure
        return self

    def _build(self) -> None:
        try:
            repository_copy(self.repo)
            subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
            env = self.env = self._environment()
            if self._stopping:
                return
            # As repo2docker: from the repository's root, then postBuild (executable, run from the root).
            cmd = [str(self.venv / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir", "--no-compile",
                   "-r", "binder/requirements.txt"]
            with tempfile.TemporaryFile() as out:
                self._pip = subprocess.Popen(cmd, cwd=self.repo, env=env, stdout=out, stderr=subprocess.STDOUT)
                code = self._pip.wait(timeout=PIP_TIMEOUT)
                out.seek(0)
                assert code == 0 or self._stopping, f"{' '.join(cmd)} exited with {code}:\n{out.read()[-8000:].decode()}"
            post_build = self.repo / "binder" / "postBuild"
            if post_build.exists() and not self._stopping:
                run(["bash", str(post_build)], self.repo, env)
        except BaseException as e:  # the test raises it
            self._failure = e

    def remove(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def stop(self) -> None:
        """At the session's end: pip killed if it still runs, the folder removed."""
        if self._thread is None:
            return
        self._stopping = True
        if self._pip is not None and self._pip.poll() is None:
            self._pip.kill()
        self._thread.join(timeout=60)
        self.remove()


BUILD = BinderBuild()  # the session's one build
