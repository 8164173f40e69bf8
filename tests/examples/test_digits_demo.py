"""The digits demo (`make demo`) trains to >= 90% held-out accuracy, the same way every run."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import subprocess
import sys

import pytest
from support import ROOT

pytest.importorskip("sklearn")

DEMO = ROOT / "examples" / "digits" / "train.py"


@pytest.fixture(scope="module")
def demo():
    saved_path = list(sys.path)
    spec = importlib.util.spec_from_file_location("digits_demo_train", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # puts examples/digits on sys.path for digits_data
    yield module
    sys.path[:] = saved_path
    sys.modules.pop("digits_data", None)


@pytest.fixture(scope="module")
def first_run(demo):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        losses, accuracy = demo.train()
    return losses, accuracy, out.getvalue()


def test_demo_reaches_90_percent(demo, first_run):
    losses, accuracy, out = first_run
    assert accuracy >= 0.9, out
    assert len(losses) == demo.EPOCHS and losses[-1] < losses[0] / 10
    lines = out.splitlines()
    assert len(lines) == demo.EPOCHS + 1  # one line an epoch, then the accuracy
    assert lines[-1].startswith("held-out accuracy: ")


def test_two_runs_give_identical_losses(demo, first_run):
    losses, accuracy, _ = first_run
    again, accuracy_again = demo.train(verbose=False)
    assert again == losses  # bit for bit: fixed init, fixed split, fixed shuffle
    assert accuracy_again == accuracy


def test_make_demo_prints_the_same_from_anywhere(first_run, tmp_path):
    """What `make demo` runs, from another working directory, in a fresh process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, str(DEMO)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == first_run[2]


def test_batch_norm_and_dropout_variant_trains_and_uses_running_statistics(demo):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        losses, accuracy = demo.train(epochs=4, variant="bn")
    assert accuracy >= 0.9, out.getvalue()
    with contextlib.redirect_stdout(io.StringIO()):
        again, _ = demo.train(epochs=4, variant="bn")
    assert again == losses  # Train(seed) draws the same dropout masks run after run


def test_the_cnn_variant_beats_the_mlps_held_out_accuracy(demo, first_run):
    """`--variant cnn`: two convolutions and a pooling (digits_cnn.ss) above the MLP's accuracy, and
    above the 95.29% the demo's MLP printed when the CNN was added."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        losses, accuracy = demo.train(variant="cnn")
    assert accuracy > max(first_run[1], 0.9529), out.getvalue()
    assert out.getvalue().splitlines()[-1].startswith("held-out accuracy: ") and losses[-1] < losses[0] / 10
