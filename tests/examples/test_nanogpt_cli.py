"""examples/nanogpt/train.py, nanoGPT's train.py and sample.py as a driver, at a tiny size: the val
loss falls, the checkpoint and its JSON are written whole (no temporary file left), a resumed run
starts at the saved iter_num and best_val_loss and ends where a straight run does, the same seed
samples the same text, a bad JSON is refused with a clear error and changes nothing, and the
command line runs."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support import ROOT

SCRIPT = ROOT / "examples" / "nanogpt" / "train.py"
CORPUS = ROOT / "examples" / "attention" / "corpus.txt"
START = "The "
NEW = 24
TINY = ["--block-size", "16", "--n-layer", "1", "--n-head", "2", "--head-size", "8", "--grad-accum", "2",
        "--batch-size", "4", "--eval-interval", "10", "--eval-iters", "4", "--learning-rate", "1e-2",
        "--warmup-iters", "2", "--lr-decay-iters", "30", "--min-lr", "1e-3", "--max-new-tokens", str(NEW),
        "--num-samples", "2", "--start", START, "--seed", "7", "--quiet"]


def driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nanogpt_train", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


nanogpt = driver()


def main(out: Path, iters: int, *more: str) -> dict[str, Any]:
    return nanogpt.main([*TINY, "--out-dir", str(out), "--iters", str(iters), *more])


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Twenty iterations, and the same again from the same seed; the first resumed to thirty; thirty
    straight. Every eval saves (--always-save-checkpoint), so the resume starts at iteration 20."""
    out = {name: tmp_path_factory.mktemp(name) for name in ("first", "again", "straight")}
    first = main(out["first"], 20, "--always-save-checkpoint")
    saved = json.loads((out["first"] / "ckpt.json").read_text())
    after_first = files(out["first"])
    again = main(out["again"], 20, "--always-save-checkpoint")
    resumed = main(out["first"], 30, "--always-save-checkpoint", "--resume")
    straight = main(out["straight"], 30, "--always-save-checkpoint")
    return {"out": out, "first": first, "saved": saved, "after_first": after_first, "again": again,
            "resumed": resumed, "straight": straight}


def test_training_lowers_the_val_loss_and_saves_the_checkpoint_whole(runs: dict[str, Any]) -> None:
    first, saved = runs["first"], runs["saved"]
    assert first["iter_num"] == first["steps"] == 20 and len(first["losses"]) == 20
    assert [it for it, _, _ in first["evals"]] == [0, 10, 20]
    assert first["val_loss"] < first["first_val_loss"] - 0.3, first["evals"]  # ln 87 = 4.47 at the start
    assert set(runs["after_first"]) == {"ckpt.safetensors", "ckpt.json"}  # no temporary file beside them
    assert saved["iter_num"] == 20 and saved["best_val_loss"] == first["best_val_loss"] == first["val_loss"]
    assert saved["vocab"] == "".join(sorted(set(CORPUS.read_text())))
    assert saved["config"]["n_layer"] == 1 and saved["config"]["max_iters"] == 20


def test_only_a_better_val_loss_is_saved_and_never_at_iteration_zero(tmp_path: Path) -> None:
    result = main(tmp_path, 0, "--num-samples", "0")
    assert result["iter_num"] == 0 and result["evals"][0][0] == 0 and result["samples"] == []
    assert list(tmp_path.iterdir()) == []  # iteration 0 set best_val_loss but wrote nothing


def test_resuming_starts_at_the_saved_iteration_and_ends_as_a_straight_run(runs: dict[str, Any]) -> None:
    resumed, straight, saved = runs["resumed"], runs["straight"], runs["saved"]
    assert resumed["start_iter"] == saved["iter_num"] == 20
    assert resumed["iter_num"] == resumed["steps"] == 30 and len(resumed["losses"]) == 10
    assert resumed["evals"][0] == (20, *runs["first"]["evals"][-1][1:])  # the model as saved
    assert resumed["best_val_loss"] <= saved["best_val_loss"]
    # Each iteration's batches and dropout come from (seed, iteration): the same as thirty straight.
    assert resumed["losses"] == straight["losses"][20:]
    assert resumed["evals"] == straight["evals"][2:] and resumed["samples"] == straight["samples"]
    after = json.loads((runs["out"]["first"] / "ckpt.json").read_text())
    assert after["iter_num"] == 30 and after["config"]["max_iters"] == 30


def test_the_same_seed_samples_the_same_text_from_the_corpus_characters(runs: dict[str, Any]) -> None:
    first, again = runs["first"], runs["again"]
    assert first["samples"] == again["samples"] and first["losses"] == again["losses"]
    vocab = set(first["vocab"])
    assert len(first["samples"]) == 2 and first["samples"][0] != first["samples"][1]  # two draws
    for text in first["samples"]:
        assert len(text) == len(START) + NEW and text.startswith(START) and set(text) <= vocab


def test_sample_from_the_api_repeats_with_its_seed_and_reloads_for_other_sizes(runs: dict[str, Any],
                                                                               tmp_path: Path) -> None:
    run = nanogpt.train(dataclasses.replace(runs["first"]["config"], out_dir=str(tmp_path), max_iters=0), log=None)
    try:
        one = nanogpt.sample(run, "a", num_samples=3, seed=1)
        assert one == nanogpt.sample(run, "a", num_samples=3, seed=1) != nanogpt.sample(run, "a", num_samples=3, seed=2)
        longer = nanogpt.sample(run, "a", num_samples=1, max_new_tokens=5, top_k=1000, seed=1)  # top_k: at most V
        assert len(longer[0]) == 6
        with pytest.raises(nanogpt.SettingsError, match="not in the corpus's characters"):
            nanogpt.sample(run, "\x00")
    finally:
        run.stop()


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.json"
    target.write_text("old")

    def fails(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        nanogpt.write_safely(target, fails)
    assert files(tmp_path) == {"ckpt.json": b"old"}
    nanogpt.write_safely(target, lambda tmp: tmp.write_text("new"))
    assert files(tmp_path) == {"ckpt.json": b"new"}


def corrupt(path: Path, change: dict[str, Any]) -> None:
    state = json.loads(path.read_text())
    for key, value in change.items():
        if key.startswith("config."):
            state["config"][key.removeprefix("config.")] = value
        else:
            state[key] = value
    path.write_text(json.dumps(state))


@pytest.mark.parametrize("change, message", [
    ({"iter_num": "20"}, "iter_num must be a whole number >= 0, not '20'"),
    ({"iter_num": -1}, "iter_num must be a whole number >= 0, not -1"),
    ({"iter_num": True}, "iter_num must be a whole number"),
    ({"best_val_loss": "low"}, "best_val_loss must be a finite number >= 0"),
    ({"config.n_layer": 1.5}, "Config.n_layer must be int, not 1.5"),
    ({"config.beta2": 1.0}, r"Config.beta2 must be in \[0, 1\)"),
    ({"vocab": "ba"}, "vocab must be the corpus's distinct characters, sorted"),
    ({"iter_num": 10}, "holds 20 optimizer steps but .* says iter_num 10"),  # caught after the restore
])
def test_a_bad_json_is_refused_with_a_clear_error_and_changes_nothing(
        runs: dict[str, Any], tmp_path: Path, change: dict[str, Any], message: str) -> None:
    for name, data in runs["after_first"].items():
        (tmp_path / name).write_bytes(data)
    corrupt(tmp_path / "ckpt.json", change)
    before = files(tmp_path)
    with pytest.raises(nanogpt.CheckpointError, match=message):
        main(tmp_path, 30, "--resume")
    assert files(tmp_path) == before


def test_a_json_that_is_no_json_and_a_missing_one_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(nanogpt.CheckpointError, match="no checkpoint to resume from"):
        main(tmp_path, 30, "--resume")
    (tmp_path / "ckpt.json").write_text("[" * 100_000)
    with pytest.raises(nanogpt.CheckpointError, match="not a run's JSON"):
        main(tmp_path, 30, "--resume")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.json"]


def test_a_checkpoint_that_is_not_one_is_a_clear_error(runs: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "ckpt.json").write_bytes(runs["after_first"]["ckpt.json"])
    (tmp_path / "ckpt.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(nanogpt.CheckpointError, match="can't resume: .* is not a ShapeScript checkpoint"):
        main(tmp_path, 30, "--resume")


def test_the_command_line_reports_errors_without_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--out-dir", str(tmp_path), "--resume"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert "train.py: error: " in str(exited.value.code) and "no checkpoint to resume from" in str(exited.value.code)
    with pytest.raises(SystemExit) as exited:
        nanogpt.main(["--batch-size", "0"])
    assert exited.value.code == 2 and "Config.batch_size must be at least 1, not 0" in capsys.readouterr().err
    for bad, message in (["--start", "\x00"], "not in the corpus's characters"), (["--temperature", "0"], "> 0"):
        with pytest.raises(SystemExit) as exited:  # checked before it trains
            nanogpt.main(["--out-dir", str(tmp_path / "none"), "--iters", "1", *bad])
        assert exited.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(nanogpt.SettingsError, match="unknown device kind `gpu`"):
        nanogpt.main(["--out-dir", str(tmp_path / "none"), "--iters", "1", "--devices", "gpu[0]"])
    assert not (tmp_path / "none").exists()
    with pytest.raises(SystemExit) as exited:
        nanogpt.main(["--help"])
    assert exited.value.code == 0 and "--resume" in capsys.readouterr().out


def test_the_script_runs_from_the_command_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--iters", "2", "--eval-interval", "1",
                           "--out-dir", str(tmp_path), "--num-samples", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    printed = done.stdout.split("\n---------------\n")  # each sample, then sample.py's separator
    assert len(printed) == 2 and printed[1] == "", done.stdout
    assert printed[0].startswith(START) and len(printed[0]) == len(START) + NEW, done.stdout
    assert set(os.listdir(tmp_path)) == {"ckpt.safetensors", "ckpt.json"}


def test_two_devices_train_and_sample_as_one_does_and_leave_no_worker(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = []
    load_program = nanogpt.load_program

    def recording(*args: Any) -> Any:
        loaded.append(load_program(*args))
        return loaded[-1]

    monkeypatch.setattr(nanogpt, "load_program", recording)
    one = main(tmp_path / "one", 3, "--eval-interval", "3")
    two = main(tmp_path / "two", 3, "--eval-interval", "3", "--devices", "cpu[0 1]")
    assert [str(p.devices) for p in loaded] == ["cpu", "cpu[0 1]"]
    assert all(p.pool is None for p in loaded)  # main stopped the workers
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-12, rel=0)  # the same dropout, batch by batch
    assert two["val_loss"] == pytest.approx(one["val_loss"], abs=1e-12, rel=0)
    assert two["samples"] == one["samples"]
