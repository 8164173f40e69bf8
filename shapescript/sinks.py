"""Where `write(log, logs(...))` sends records: `stdout()`, `jsonl(path)`, `memory()`, `live()`,
`tensorboard(log_dir)`, `csv(path)` and `call(fn)`; `Sink` is the protocol they all follow, and
a sink of your own too (docs/api.md's "Sinks")."""

import csv as _csv
import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

import torch

from shapescript.runtime.model import leaves
from shapescript.runtime.sinks import FileSink, Logs, Sink, Value, jsonl, logs, memory, stdout


def live(every: int = 10, fps: float = 10.0, log: bool | str | Sequence[str] = False, smooth: float = 0.0) -> Sink:
    """In a Jupyter notebook, a line chart of each logged number, redrawn as records arrive (at most
    `fps` times a second), its y axis logarithmic with `log=True` (or for the keys named, as
    `log=("loss",)`), its line smoothed by `smooth` (0 to 1, TensorBoard's moving average) over the
    faint values; elsewhere, the first record and every `every`-th (steps 1, every, 2·every, ...)
    printed as stdout() prints them. Keeps every
    record in `.records`, as memory() does."""
    from shapescript.notebook.live import LiveSink  # imported when asked for: ipywidgets only in a kernel
    return LiveSink(every, fps, log, smooth)


# -- TensorBoard ------------------------------------------------------------------------------------

class TensorBoardSink(Sink):
    """Each record into a TensorBoard event file in `log_dir` through torch's SummaryWriter
    (`.writer`, there for anything else to log): a number as a scalar, a logged tensor of one axis
    or more as a histogram, a string as text, each under its key at the record's step; with a
    `model`, histograms of its params every `histograms_every`-th record. Flushed each record."""

    def __init__(self, writer: Any, model: Any, histograms_every: int) -> None:
        super().__init__()
        self.writer, self.model, self.histograms_every = writer, model, histograms_every
        self.log_dir: str = writer.log_dir
        # Scalars alone read nothing of the program: the next step may be sent before this record
        # is written. Histograms read the model, as the step that the record holds left it.
        self.passive = model is None

    def emit(self, step: int, values: dict[str, Value]) -> None:
        for key, value in values.items():
            if isinstance(value, str):
                self.writer.add_text(key, value, step)
            elif isinstance(value, list):
                _histogram(self.writer, key, torch.tensor(value, dtype=torch.float64), step)
            else:  # a number or bool
                self.writer.add_scalar(key, float(value), step)
        if self.model is not None and step % self.histograms_every == 0:
            state = self.model.state_dict()  # on several devices: one call, worker 0's copy
            for name, leaf in leaves(self.model.spec):
                if leaf.kind == "param" and leaf.dtype.is_floating_point:
                    _histogram(self.writer, f"params/{name}", state[name], step)
        self.writer.flush()

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()  # flushes


def _histogram(writer: Any, tag: str, values: torch.Tensor, step: int) -> None:
    """A histogram of the finite values (TensorBoard's can't hold NaN or inf); none: no histogram."""
    flat = values.detach().reshape(-1).cpu().double()
    flat = flat[torch.isfinite(flat)]
    if flat.numel():
        writer.add_histogram(tag, flat, step)


def tensorboard(log_dir: str | os.PathLike[str], *, model: Any = None,
                histograms_every: int | None = None) -> TensorBoardSink:
    """A TensorBoard event file in `log_dir` (made if missing; a new file each sink, never one
    overwritten): each logged number as a scalar at the record's step, and with `model=m`, a
    histogram of each of its params every `histograms_every`-th record (100 by default). Needs the
    tensorboard package (`pip install 'shapescript[tensorboard]'`)."""
    if histograms_every is not None and model is None:
        raise ValueError("tensorboard: histograms_every is for the model's params: give the model too, "
                         "as tensorboard(log_dir, model=m, histograms_every=10)")
    every = 100 if histograms_every is None else histograms_every
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"tensorboard: histograms_every must be a positive int (a histogram every N-th record), "
                         f"got {histograms_every!r}")
    if model is not None and not (callable(getattr(model, "state_dict", None)) and hasattr(model, "spec")):
        raise TypeError(f"tensorboard: model must be a ShapeScript model (prog.Mlp.init(...)), "
                        f"got {type(model).__name__}")
    try:
        from torch.utils.tensorboard import SummaryWriter  # imported when asked for: tensorboard is optional
    except ImportError as e:
        raise ImportError("ss.sinks.tensorboard needs the tensorboard package: pip install tensorboard "
                          "(or pip install 'shapescript[tensorboard]')") from e
    return TensorBoardSink(SummaryWriter(log_dir=os.fspath(log_dir)), model, every)


# -- CSV --------------------------------------------------------------------------------------------

class CsvSink(FileSink):
    """Each record a row of a CSV file: its columns `step` and the logged keys, fixed by `keys` or
    by the first record; a key a record lacks is a blank cell, one the header lacks a ValueError."""

    passive = True

    def __init__(self, path: str | os.PathLike[str], keys: Sequence[str] | None, overwrite: bool) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.keys: list[str] | None = None if keys is None else _columns(keys, "csv: keys")
        try:
            self.file: TextIO = open(self.path, "w" if overwrite else "x", newline="", encoding="utf-8")
        except FileExistsError as e:
            raise FileExistsError(e.errno, f"csv: {self.path} exists already; give a new path, or "
                                  f"overwrite=True to replace it", self.path) from None
        self.rows = _csv.writer(self.file)
        if self.keys is not None:
            self._header()

    def _header(self) -> None:
        assert self.keys is not None
        self.rows.writerow(["step", *self.keys])
        self.file.flush()

    def emit(self, step: int, values: dict[str, Value]) -> None:
        if self.keys is None:
            self.keys = _columns(values, f"csv: record {step}")
            self._header()
        extra = [k for k in values if k not in self.keys]
        if extra:
            raise ValueError(f"csv: record {step} logs {', '.join(f'`{k}`' for k in extra)}, which the file's "
                             f"header ({', '.join(['step', *self.keys])}) has no column for: its columns are the "
                             f"first record's keys, or those given as csv(path, keys=[...]); name every key "
                             f"the program logs there")
        self.rows.writerow([step, *(_cell(values[k]) if k in values else "" for k in self.keys)])
        self.file.flush()


def _columns(keys: Iterable[str], what: str) -> list[str]:
    columns = list(keys)
    if isinstance(keys, str) or not all(isinstance(k, str) for k in columns):
        raise TypeError(f"{what}: expected the logged keys' names, as keys=['loss', 'acc'], got {keys!r}")
    if "step" in columns:
        raise ValueError(f"{what}: `step` is the step's column; log the value under another name")
    if len(set(columns)) != len(columns):
        raise ValueError(f"{what}: a key named twice in {columns}")
    return columns


def _cell(value: Value) -> Value:
    """A number as Python writes it (a float's repr reads back to the same float), a tensor's
    values as a JSON list."""
    return json.dumps(value) if isinstance(value, list) else value


def csv(path: str | os.PathLike[str], keys: Sequence[str] | None = None, *, overwrite: bool = False) -> CsvSink:
    """A CSV file, a row each record: `step`, then a column for each key, in the order of `keys` or
    of the first record's. A record without one of them leaves its cell blank; one with a key the
    header lacks is a ValueError. Made when the sink is (an existing file is a FileExistsError
    unless `overwrite=True`), and flushed each record."""
    return CsvSink(path, keys, overwrite)


# -- a function of yours ----------------------------------------------------------------------------

class CallSink(Sink):
    """Calls `fn(step, values)` for each record: values a dict of plain Python values, new for each
    record. `passive`: the function reads nothing of the program (no model), so a loop on several
    devices may send the next step before the function is called."""

    def __init__(self, fn: Callable[[int, dict[str, Value]], object], passive: bool) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"call: expected a function of (step, record), got {type(fn).__name__}")
        if not isinstance(passive, bool):
            raise TypeError(f"call: passive is True or False, got {passive!r}")
        self.fn, self.passive = fn, passive

    def emit(self, step: int, values: dict[str, Value]) -> None:
        try:
            self.fn(step, values)
        except Exception as e:
            e.add_note(f"in the function ss.sinks.call was given ({_name(self.fn)}), at step {step}")
            raise


def _name(fn: object) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return name if isinstance(name, str) else repr(fn)


def call(fn: Callable[[int, dict[str, Value]], object], *, passive: bool = False) -> CallSink:
    """Calls `fn(step, record)` for each record, `record` a dict of the logged values as Python
    numbers (or lists, strings); W&B's `ss.sinks.call(lambda step, r: wandb.log(r, step=step),
    passive=True)`. `passive=True` says `fn` reads nothing of the program, as a logger's."""
    return CallSink(fn, passive)


__all__ = ["CallSink", "CsvSink", "Logs", "Sink", "TensorBoardSink", "Value", "call", "csv", "jsonl", "live", "logs",
           "memory", "stdout", "tensorboard"]
