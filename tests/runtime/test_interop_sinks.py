"""Sinks on real libraries, on one device: TensorBoard's event files (read back with tensorboard's
own EventAccumulator), CSV files (read back with csv.DictReader) and a function of the user's, each
given the records of a README-like MLP's loop; and the sink protocol they are built on (`emit`,
`flush`, `close`, the old `_emit`). tests/several/test_interop_sinks_several.py does the same on
`cpu[0 1]`."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from programs import SINK_BATCH, SINK_MLP, SINK_STEPS, sink_digits

import shapescript as ss
from shapescript.runtime.sinks import Sink, Value, logs, write

needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                       reason="the tensorboard package is not installed")

BATCH, STEPS = SINK_BATCH, SINK_STEPS

MLP = SINK_MLP


digits = sink_digits


@pytest.fixture(scope="module")
def prog() -> Any:
    return ss.load(MLP, name="mlp.ss")


def fit(prog: Any, sink: Any, steps: int = STEPS) -> tuple[Any, Any]:
    """`fit` from the same fresh model, over `steps` batches, into `sink`: the model and optimizer."""
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-2)
    prog.fit(m, opt, digits(steps), sink)
    return m, opt


def reference(prog: Any, steps: int = STEPS) -> tuple[list[float], dict[str, torch.Tensor]]:
    """What a memory sink gets from the same run, and the params after it."""
    sink = ss.sinks.memory()
    m, _ = fit(prog, sink, steps)
    return [r["loss"] for r in sink.records], m.state_dict()


def read_events(log_dir: Path) -> Any:
    from tensorboard.backend.event_processing import event_accumulator
    events = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0})
    events.Reload()
    return events


# -- TensorBoard ----------------------------------------------------------------------------------

@needs_tensorboard
def test_tensorboard_holds_every_steps_loss(prog: Any, tmp_path: Path) -> None:
    losses, _ = reference(prog)
    sink = ss.sinks.tensorboard(tmp_path / "run")
    assert sink.passive  # scalars read nothing of the program
    fit(prog, sink)
    # Flushed each record: readable before the sink is closed.
    scalars = read_events(tmp_path / "run").Scalars("loss")
    assert [s.step for s in scalars] == list(range(1, STEPS + 1))
    assert [s.value for s in scalars] == losses  # f32 losses: TensorBoard's f32 holds them exactly
    sink.close()
    sink.close()  # again: nothing
    with pytest.raises(ValueError, match="closed"):
        write(sink, logs(loss=1.0))


@needs_tensorboard
def test_tensorboard_histograms_of_the_params(prog: Any, tmp_path: Path) -> None:
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-2)
    with ss.sinks.tensorboard(tmp_path, model=m, histograms_every=2) as sink:
        assert not sink.passive  # it reads the model
        prog.fit(m, opt, digits(), sink)
    events = read_events(tmp_path)
    assert set(events.Tags()["histograms"]) == {"params/w1", "params/w2"}
    for name in ("w1", "w2"):
        hist = events.Histograms(f"params/{name}")
        assert [h.step for h in hist] == [2, 4]
        last, final = hist[-1].histogram_value, m.state_dict()[name]
        assert last.num == final.numel()
        assert last.sum == pytest.approx(float(final.double().sum()), abs=1e-5)
        assert (last.min, last.max) == pytest.approx((float(final.min()), float(final.max())))
    assert [s.step for s in events.Scalars("loss")] == [1, 2, 3, 4]


@needs_tensorboard
def test_tensorboard_tensors_and_text(tmp_path: Path) -> None:
    with ss.sinks.tensorboard(tmp_path) as sink:
        write(sink, logs(acc=torch.tensor(0.5), n=3, ok=True, grads=torch.tensor([1.0, float("nan"), 3.0]),
                         phase="train"))
    events = read_events(tmp_path)
    assert [(s.step, s.value) for s in events.Scalars("acc")] == [(1, 0.5)]
    assert [s.value for s in events.Scalars("n")] == [3.0] and [s.value for s in events.Scalars("ok")] == [1.0]
    [grads] = events.Histograms("grads")  # a logged tensor: its finite values' histogram
    assert (grads.step, grads.histogram_value.num, grads.histogram_value.sum) == (1, 2, 4.0)
    assert "phase/text_summary" in events.Tags()["tensors"]


@needs_tensorboard
def test_tensorboard_settings_checked(prog: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="give the model too"):
        ss.sinks.tensorboard(tmp_path, histograms_every=10)
    m = prog.Mlp.init(seed=0)
    with pytest.raises(ValueError, match="positive int"):
        ss.sinks.tensorboard(tmp_path, model=m, histograms_every=0)
    with pytest.raises(TypeError, match="ShapeScript model"):
        ss.sinks.tensorboard(tmp_path, model=torch.nn.Linear(2, 2))
    assert not list(tmp_path.iterdir())  # nothing made


def test_tensorboard_without_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` fails
    for name in [n for n in sys.modules if n.startswith("torch.utils.tensorboard")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match="needs the tensorboard package: pip install tensorboard"):
        ss.sinks.tensorboard(tmp_path)


# -- CSV ------------------------------------------------------------------------------------------

def test_csv_holds_every_steps_loss(prog: Any, tmp_path: Path) -> None:
    losses, _ = reference(prog)
    path = tmp_path / "log.csv"
    with ss.sinks.csv(path) as sink:
        fit(prog, sink)
        rows = list(csv.DictReader(path.open(newline="")))  # flushed each record
    assert [r["step"] for r in rows] == ["1", "2", "3", "4"]
    assert [float(r["loss"]) for r in rows] == losses  # a float's repr reads back to itself
    assert list(rows[0]) == ["step", "loss"]


def test_csv_columns_are_fixed(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    with ss.sinks.csv(path, keys=["loss", "val_loss"]) as sink:
        write(sink, logs(loss=0.5))
        write(sink, logs(val_loss=torch.tensor(0.25), loss=0.75))
        write(sink, logs(loss=torch.tensor([1.0, 2.0])))
        with pytest.raises(ValueError, match=r"record 4 logs `acc`, which the file's header \(step, loss, "
                                             r"val_loss\) has no column for"):
            write(sink, logs(loss=1.0, acc=0.5))
    assert path.read_text().splitlines() == ["step,loss,val_loss", "1,0.5,", "2,0.75,0.25", '3,"[1.0, 2.0]",']
    # Without keys, the first record's are the columns.
    with ss.sinks.csv(tmp_path / "first.csv") as sink:
        write(sink, logs(loss=1.0))
        with pytest.raises(ValueError, match="`acc`"):
            write(sink, logs(acc=1.0))
    with pytest.raises(ValueError, match="`step` is the step's column"):
        ss.sinks.csv(tmp_path / "s.csv", keys=["step"])
    with pytest.raises(TypeError, match="keys' names"):
        ss.sinks.csv(tmp_path / "t.csv", keys="loss")


def test_csv_never_overwrites_unless_asked(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text("kept\n")
    with pytest.raises(FileExistsError, match="exists already; give a new path, or overwrite=True"):
        ss.sinks.csv(path)
    assert path.read_text() == "kept\n"
    with ss.sinks.csv(path, overwrite=True) as sink:
        write(sink, logs(loss=2.0))
    assert path.read_text().splitlines() == ["step,loss", "1,2.0"]


# -- a function of yours --------------------------------------------------------------------------

def test_call_gets_every_record(prog: Any) -> None:
    losses, _ = reference(prog)
    calls: list[tuple[int, dict[str, Value]]] = []
    sink = ss.sinks.call(lambda step, record: calls.append((step, record)))
    assert not sink.passive  # unless said: the function might read the model
    fit(prog, sink)
    assert calls == [(k + 1, {"loss": loss}) for k, loss in enumerate(losses)]
    assert all(type(r["loss"]) is float for _, r in calls)
    assert ss.sinks.call(print, passive=True).passive
    with pytest.raises(TypeError, match="a function of"):
        ss.sinks.call("wandb.log")  # type: ignore[arg-type]


@pytest.mark.parametrize("at", [1, 3])
def test_a_raising_call_ends_the_loop_with_the_models_as_its_step_left_them(prog: Any, at: int) -> None:
    """The rule of every sink that raises: the program's loop ends with the sink's own error, the
    models as the step whose record failed left them, the records before it given."""
    got: list[int] = []

    def log(step: int, record: dict[str, Value]) -> None:
        if step == at:
            raise ConnectionError("the logging service is down")
        got.append(step)

    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-2)
    with pytest.raises(ConnectionError, match="the logging service is down") as info:
        prog.fit(m, opt, digits(), ss.sinks.call(log))
    assert f"in the function ss.sinks.call was given (test_a_raising_call_ends_the_loop_with_the_models_as_its_" \
           f"step_left_them.<locals>.log), at step {at}" in info.value.__notes__
    assert got == list(range(1, at))
    _, want = reference(prog, at)  # the steps up to the one whose record failed
    for name, value in m.state_dict().items():
        torch.testing.assert_close(value, want[name], atol=0, rtol=0)


# -- the protocol ---------------------------------------------------------------------------------

def test_a_sink_of_your_own() -> None:
    class Buffered(Sink):
        passive = True

        def __init__(self) -> None:
            super().__init__()
            self.held: list[tuple[int, dict[str, Value]]] = []
            self.sent: list[tuple[int, dict[str, Value]]] = []

        def emit(self, step: int, values: dict[str, Value]) -> None:
            self.held.append((step, values))

        def flush(self) -> None:
            self.sent += self.held
            self.held.clear()

    with Buffered() as sink:
        write(sink, logs(loss=torch.tensor(2.5)))
        write(sink, logs(loss=1.5, w=torch.tensor([1, 2])))
        assert sink.sent == []
    assert sink.closed and sink.sent == [(1, {"loss": 2.5}), (2, {"loss": 1.5, "w": [1, 2]})]


def test_a_sink_that_defines_the_old_emit() -> None:
    class Old(Sink):
        def __init__(self) -> None:
            super().__init__()
            self.got: list[tuple[int, dict[str, Value]]] = []

        def _emit(self, step: int, values: dict[str, Value]) -> None:
            self.got.append((step, values))

    class OlderStill(Old):
        def _emit(self, step: int, values: dict[str, Value]) -> None:
            self.got.append((-step, values))

    for kind, sign in ((Old, 1), (OlderStill, -1)):
        sink = kind()
        write(sink, logs(loss=0.5))
        assert sink.got == [(sign, {"loss": 0.5})]

    class Nothing(Sink):
        pass

    with pytest.raises(TypeError, match="abstract method emit"):
        Nothing()  # type: ignore[abstract]
