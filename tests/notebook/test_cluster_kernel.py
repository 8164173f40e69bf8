"""`%shapescript cluster` through a real kernel: the kernel connects to a
simulated Ray cluster of 2 nodes on this machine's loopback, trains the README MLP on `cpu[0 1]`
there, equal to the same steps on `cpu` in this process; its workers are Ray actors of ours, and a
restart of the kernel leaves no live actor or placement group of ours on the cluster, and neither
does `%shapescript cluster off`, after which the workers run here. Users' mistakes (a misspelt
address, nothing there, no Ray) are one line each.

The cluster is tests/cluster's (tests/conftest.py's `ray_cluster`: this test runs just before
those), and this process looks at it through its own connection (as ss.cluster, which trains
nothing here). Skipped without Ray (`pip install 'shapescript[ray]'`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ray_support import eventually_nothing_left, ours_on_the_cluster  # skips without Ray
from test_kernel import MLP, Kernel, Run, cell, children

import shapescript as ss
from shapescript.parallel.ray_workers import GROUP_PREFIX

STEPS, ROWS = 5, 64  # 64 rows: as tests/several/test_equivalence.py, within 1e-5 of one device
# The batches, made by the same code in the kernel and here.
BATCHES = (f"g = torch.Generator().manual_seed(0)\n"
           f"batches = [{{'img': torch.randn({ROWS}, 784, generator=g), "
           f"'label': torch.randint(0, 10, ({ROWS},), generator=g)}} for _ in range({STEPS})]\n")
GONE_WITHIN = 15.0  # seconds for the restarted kernel's actors and placement group to be gone


@pytest.fixture
def kernel(ray_cluster: Any, tmp_path: Path) -> Iterator[Kernel]:
    """A kernel started once the cluster runs, so that it inherits RAY_TMPDIR; shut down before it."""
    k = Kernel(tmp_path / "kernel")
    try:
        k.ok("%load_ext shapescript\nimport json, sys, torch\nimport shapescript as ss")
        yield k
    finally:
        k.shutdown()


def one_line_error(run: Run, *pieces: str) -> None:
    """The cell failed with a message of one line holding `pieces`, and no traceback."""
    assert run.status == "error" and run.error is not None and run.error["ename"] == "NotebookError", run
    assert "\n" not in run.traceback and all(p in run.traceback for p in pieces), run.traceback


def reference(batches: list[dict[str, torch.Tensor]]) -> tuple[list[float], torch.Tensor]:
    """The same steps on one device in this process: the losses and w1."""
    prog = ss.load(MLP, name="mlp.ss")
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    return [float(prog.train_step(m, opt, b)) for b in batches], m.w1


@pytest.mark.slow
def test_a_notebook_trains_on_the_cluster_and_a_restart_leaves_nothing(
        ray_cluster: Any, kernel: Kernel, tmp_path: Path) -> None:
    address = ray_cluster.address
    assert "ray" not in kernel.ok("print(json.dumps(sorted(sys.modules)))").value()  # nor imported, so far
    assert "%shapescript cluster A     run the workers on the Ray cluster at A" in kernel.ok("%shapescript").stdout
    assert "no cluster; the workers run on this machine" in kernel.ok("%shapescript cluster").plain[0]
    assert kernel.ok("%shapescript cluster off").stdout == "No cluster: the workers already run on this machine.\n"
    without_ray = kernel.run("sys.modules['ray'] = None  # `import ray` raises ImportError\n"
                             "try:\n    %shapescript cluster auto\nfinally:\n    del sys.modules['ray']")
    one_line_error(without_ray, "needs Ray, which isn't installed", "pip install 'shapescript[ray]'")
    usage = kernel.run("%shapescript cluster http://nowhere")  # IPython's UsageError: one line, on stderr
    assert usage.status == "error" and usage.error is None
    assert "'http://nowhere' isn't a cluster's address" in usage.stderr and "ray://host:port" in usage.stderr
    one_line_error(kernel.run("%shapescript cluster 127.0.0.1:1"),
                   "couldn't connect to the Ray cluster at 127.0.0.1:1: nothing answers at 127.0.0.1:1")

    connected = kernel.ok(f"%shapescript cluster {address}")
    assert f"Connected to the Ray cluster at {address} (2 nodes alive, 4 CPUs, 0 GPUs)" in connected.stdout
    shown = kernel.ok("%shapescript cluster").plain[0]
    assert f"ShapeScript's workers run on the Ray cluster at {address}: 2 of 2 nodes alive" in shown
    rows = [line for line in shown.splitlines() if "  127.0.0.1  " in line]  # a node's row: its address
    assert len(rows) == 2 and all("alive  CPU 2, memory " in row for row in rows), shown
    assert sum("  head  " in row for row in rows) == 1, shown

    started = kernel.ok(cell("devices cpu[0 1]\n\n" + MLP))
    assert "Starting workers on cpu[0 1] in the background." in started.stdout
    saved = tmp_path / "w1.pt"
    losses = kernel.ok(BATCHES + "m = Mlp.init(seed=0)\nopt = ss.adamw(m, lr=1e-3)\n"
                       "losses = [float(train_step(m, opt, b)) for b in batches]\n"
                       f"torch.save(m.w1, {str(saved)!r})\nprint(json.dumps(losses))").value()
    here: dict[str, Any] = {"torch": torch}
    exec(BATCHES, here)
    expected_losses, expected_w1 = reference(here["batches"])
    assert losses == pytest.approx(expected_losses, abs=1e-5)
    w1 = torch.load(saved)
    assert w1.shape == (784, 256)
    torch.testing.assert_close(w1, expected_w1, atol=1e-5, rtol=0)

    # The program's workers are our actors, in one placement group, on the cluster.
    actors, groups = ours_on_the_cluster()
    pids = kernel.ok("print(json.dumps(ss_program.pool.pids))").value()
    assert sorted(a["Pid"] for a in actors) == sorted(pids) and len(pids) == 2
    assert len(groups) == 1 and groups[0]["name"].startswith(f"{GROUP_PREFIX}cpu[0 1]"), groups

    kernel.manager.restart_kernel(now=False)
    eventually_nothing_left(GONE_WITHIN)  # after the kernel's restart
    kernel.client.wait_for_ready(timeout=60)

    # `off` in the restarted kernel: the workers on the cluster stop, saying what went, and new ones
    # start on this machine, as the kernel's own child processes.
    kernel.ok(f"%load_ext shapescript\nimport json\n%shapescript cluster {address}")
    kernel.ok(cell("devices cpu[0 1]\n\n" + MLP))
    kernel.ok("m = Mlp.init(seed=0)")  # waits for the workers
    assert len(ours_on_the_cluster()[0]) == 2
    refused = kernel.run("%shapescript cluster off")  # m is on them: only with --discard
    assert refused.status == "error" and "`%shapescript cluster off --discard`" in refused.traceback
    assert len(ours_on_the_cluster()[0]) == 2
    left = kernel.ok("%shapescript cluster off --discard").stdout
    assert ("Stopping the workers on cpu[0 1] (back to this machine's workers); gone with them: m (Mlp model)."
            in left), left
    assert f"Disconnected from the Ray cluster at {address}: the workers run on this machine again." in left
    assert "Starting workers on cpu[0 1] in the background." in left
    eventually_nothing_left(GONE_WITHIN)  # after `%shapescript cluster off`
    local = kernel.ok("m = Mlp.init(seed=0)\nprint(json.dumps(ss_program.pool.pids))").value()
    assert set(local) <= children(kernel.pid()) and len(local) == 2
    assert "no cluster; the workers run on this machine" in kernel.ok("%shapescript cluster").plain[0]
