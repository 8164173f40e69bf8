"""A controller attached through Ray Client (`ss.cluster("ray://host:port")`), as a notebook on a laptop
that reaches only the head's client port: its workers can't connect to it, so their messages go through
Ray (parallel/ray_relay.py). Here the client server runs on the loopback, in front of the simulated
cluster (tests/conftest.py), and the controller is a process of its own (one process is either Ray's driver or
its client, not both); it opens no listening socket, and computes what one device computes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ray_support import digit_batches, eventually_nothing_left, train
from safetensors.torch import load_file

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.usefixtures("ray_cluster")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5

# The controller: trains the README MLP on cpu[0 1] through Ray Client; writes its losses, its model's
# params, and what it listened on while its workers ran.
CONTROLLER = """
import json, os, sys
import torch
from safetensors.torch import save_file
import shapescript as ss
from programs import README
from shapescript.parallel.handlers import listening_sockets
from shapescript.parallel.ray_relay import RelayedConnection

address, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
on = ss.cluster(address)
assert on.relayed, on
prog = ss.load(README, devices="cpu[0 1]", name="mlp.ss")
g = torch.Generator().manual_seed(0)
batches = [{"img": torch.randn(64, 784, generator=g), "label": torch.randint(0, 10, (64,), generator=g)}
           for _ in range(steps)]
m = prog.Mlp.init(seed=0)
opt = ss.adamw(m, lr=1e-3)
losses = [float(prog.train_step(m, opt, b)) for b in batches]
listening = listening_sockets(os.getpid())
w1 = m.w1
save_file(m.state_dict(), os.path.join(out, "state.safetensors"))
prog.stop()
with open(os.path.join(out, "result.json"), "w") as f:
    json.dump({"losses": losses, "listening": [list(a) for a in listening], "w1_shape": list(w1.shape)}, f)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def client_address(ray_cluster: Any, tmp_path: Path) -> Iterator[str]:
    """A Ray Client server on 127.0.0.1 in front of the simulated cluster (its own process, ended after)."""
    port = free_port()
    log = open(tmp_path / "client_server.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "ray.util.client.server", "--mode=legacy", "--host=127.0.0.1", f"--port={port}",
         f"--address={ray_cluster.address}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "client_server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "Ray's client server didn't start listening"
                time.sleep(0.3)
        yield f"ray://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def test_a_controller_through_ray_client_gets_what_one_device_gets(client_address: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", CONTROLLER, client_address, str(tmp_path), str(STEPS)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["listening"] == [], "a relayed controller listens on nothing"
    losses, state = train("cpu", digit_batches(STEPS, 64))
    assert result["losses"] == pytest.approx(losses, abs=1e-5)
    theirs = load_file(str(tmp_path / "state.safetensors"))
    assert set(theirs) == set(state) and result["w1_shape"] == list(state["w1"].shape)
    for name, value in state.items():
        torch.testing.assert_close(theirs[name], value, atol=1e-5, rtol=0, msg=lambda text: f"{name}: {text}")
    eventually_nothing_left(15.0)  # the client's job ended with it: its actors and group with it
