"""The tests run against this checkout's package, and leave nothing in the temp folder."""

from __future__ import annotations

import gc
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shapescript.runtime.leftovers import owner_tag, sweep  # noqa: E402  (this checkout's)


LEFTOVER_GRACE = 5.0  # seconds for workers whose controller (a kernel, a CLI run) just ended to clean up
SESSION_FOLDER = re.compile(r"shapescript-tests-(?P<pid>\d+)-(?P<start>\d+)-[a-z0-9_]+")
# Not leftovers: caches that libraries keep in the temp folder from one run to the next by design
# (torch makes torchinductor_USER whenever something imports torch._dynamo).
CACHES = re.compile(r"torchinductor_.*")


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_the_temp_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's temporary files, its subprocesses' included (TMPDIR is inherited), go to a folder
    of its own, which must be empty when the session ends: what a test, a worker pool or a controller
    it ran leaves there would be left in /tmp. Pools no one holds any more are collected first, so
    their finalizers run; a pool still held (a module's program never stopped) is a leftover. pytest's
    own tmp_path folders stay where pytest keeps them. The folder is removed either way, and a killed
    session's by the next session."""
    tmp_path_factory.getbasetemp()  # before the temp folder moves
    sweep(tempfile.gettempdir(), SESSION_FOLDER, folders=True)
    folder = Path(tempfile.mkdtemp(prefix=f"shapescript-tests-{owner_tag()}-"))
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)
    try:
        yield folder
        gc.collect()

        def leftovers() -> list[str]:
            return sorted(name for name in os.listdir(folder) if not CACHES.fullmatch(name))

        deadline = time.monotonic() + LEFTOVER_GRACE
        while leftovers() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = leftovers()
        assert not left, f"the tests left these in the temp folder (/tmp): {', '.join(left)}"
    finally:
        if before[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before[0]
        tempfile.tempdir = before[1]
        shutil.rmtree(folder, ignore_errors=True)
