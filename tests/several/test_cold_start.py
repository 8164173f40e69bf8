"""The workers' cold start: a worker enters the packages `shapescript` and `shapescript.parallel`
without running their __init__ (worker.WORKER_MAIN), so it never imports the compiler, which the
controller has; a name either package defines still works there, running its __init__ on first use."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from shapescript.api import parse_devices
from shapescript.parallel import forkserver
from shapescript.parallel.pool import WorkerPool

# What the controller imports to compile a program, and a worker never needs.
COMPILER = ["sympy", "shapescript.api", "shapescript.pipeline", "shapescript.check.program", "shapescript.parallel.pool"]
PROBE = textwrap.dedent("""
    import sys
    from shapescript.parallel.handlers import handler

    @handler("imported")
    def imported(state, names):
        return [name for name in names if name in sys.modules]

    @handler("compile_and_run")
    def compile_and_run(state, source, x):
        import shapescript as ss  # the package's __init__ runs now, in this worker
        return ss.load(source, devices="cpu", name="double.ss").double(x)

    @handler("package_names")
    def package_names(state):
        import shapescript
        return (hasattr(shapescript, "no_such_name"), shapescript.parallel.WorkerPool.__module__,
                shapescript.WorkerError.__module__)
""")


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WorkerPool, list[Any]]]:
    """A pool of two workers with the program handlers and a probe, and what they had imported when
    they were ready."""
    folder = tmp_path_factory.mktemp("probe")
    (folder / "ss_cold_probe.py").write_text(PROBE)
    sys.path.insert(0, str(folder))
    pool = WorkerPool(parse_devices("cpu[0 1]"), modules=["shapescript.parallel.program_handlers", "ss_cold_probe"])
    try:
        # Fresh interpreters, which run the prelude: a fork server that has been idle has also imported
        # torch._dynamo, which brings sympy, for torch.optim (forkserver._preload)
        with pytest.MonkeyPatch.context() as env:
            env.setenv(forkserver.ENV, "off")
            pool.start()
        imported = pool.call("imported", (COMPILER + ["shapescript.parallel.program_handlers", "torch.distributed"],))
        yield pool, imported
    finally:
        pool.stop()
        sys.path.remove(str(folder))


@pytest.mark.slow
def test_the_workers_never_import_the_compiler(started: tuple[WorkerPool, list[Any]]) -> None:
    pool, imported = started
    assert all(name in sys.modules for name in COMPILER)  # the controller has, to compile
    assert imported == [["shapescript.parallel.program_handlers", "torch.distributed"]] * 2
    assert pool.cold_start_s is not None and 0 < pool.cold_start_s < 600


@pytest.mark.slow
def test_the_package_runs_its_init_when_a_worker_first_uses_it(started: tuple[WorkerPool, list[Any]]) -> None:
    pool, _ = started
    x = torch.tensor([1.5, -2.0, 3.25])
    results = pool.call("compile_and_run", ("fn double(x: [n]) -> [n] = x * 2.0\n", x))
    for result in results:
        torch.testing.assert_close(result, x * 2, rtol=0, atol=0)
    assert pool.call("package_names", ()) == [(False, "shapescript.parallel.pool", "shapescript.errors")] * 2
    assert pool.call("imported", (["sympy", "shapescript.api"],)) == [["sympy", "shapescript.api"]] * 2


@pytest.mark.slow
def test_a_program_from_load_runs_on_workers_that_skipped_the_compiler() -> None:
    import shapescript as ss
    source = textwrap.dedent("""\
        devices cpu[0 1]
        dim D = 3

        data Ex:
            x: [D]

        fn total(batch: [b] Ex) -> [D] = sum(batch.x, over=b)
        """)
    prog = ss.load(source, name="total.ss")
    try:
        x = torch.arange(12.0).reshape(4, 3)
        torch.testing.assert_close(prog.total({"x": x}), x.sum(0))
        assert prog.pool.cold_start_s is not None
    finally:
        prog.stop()
