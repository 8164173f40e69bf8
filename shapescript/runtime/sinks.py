"""Logs and sinks: where `write(sink, logs(loss=l))` sends the values a program records.

A sink numbers the records it receives (step 1, 2, ...); tensors become Python numbers (0-d) or
nested lists when written, so records can be printed, stored as JSON or kept in memory. `Sink` is
the protocol every sink follows, ours (here, shapescript/sinks.py, notebook/live.py) and the
user's: `write` is what the program calls, `emit(step, values)` what each kind of sink defines
(docs/api.md's "Sinks" says the rest: which process, when, flushing, errors).
"""

from __future__ import annotations

import abc
import json
import math
import numbers
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import torch

Value = float | int | bool | str | list


class Logs:
    """A record of named values: Logs(loss=l, acc=a)."""

    __slots__ = ("values",)

    def __init__(self, **values: Any) -> None:
        self.values: dict[str, Any] = values

    def __repr__(self) -> str:
        return f"Logs({', '.join(f'{k}={v!r}' for k, v in self.values.items())})"


def logs(**values: Any) -> Logs:
    return Logs(**values)


def _plain(name: str, value: Any) -> Value:
    """A logged value as a Python number, bool, string or nested list."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):  # also numpy scalars
        return float(value)
    if hasattr(value, "tolist"):  # numpy arrays
        return value.tolist()
    raise TypeError(f"logs: `{name}` has type {type(value).__name__}, expected a number or tensor")


def _plain_record(record: Logs | Mapping[str, Any]) -> dict[str, Value]:
    values = record.values if isinstance(record, Logs) else record
    if not isinstance(values, Mapping):
        raise TypeError(f"write: expected logs(...), got {type(record).__name__}")
    return {name: _plain(name, v) for name, v in values.items()}


def _text(value: Value) -> str:
    """Floats with 4 decimals (scientific when that would hide them); lists element-wise."""
    if isinstance(value, list):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4f}" if value == 0 or 1e-3 <= abs(value) < 1e6 else f"{value:.4e}"
    return str(value)


class Sink(abc.ABC):
    """Receives a program's records and numbers them from step 1.

    A sink of your own subclasses this and defines `emit(step, values)`; `flush()` and `close()` if
    it holds something. The program calls `write(record)` in the controller's process (on several
    devices too: sinks never leave it), in the thread running the program's function, once for each
    `write(log, logs(...))` it runs, in that order; `write` numbers the record and turns its values
    into plain Python (`Value`s) before `emit` sees them. Nothing calls `flush` or `close` but the
    sink's owner (`close` flushes, and a `with` block closes). An error `emit` raises is the
    program's: its loop ends there, with the models as the step that record holds left them, on
    every device count (parallel/pipeline.py)."""

    # True for a sink whose writing reads nothing of the program (no model, no call of it): a loop
    # on several devices may then send the next step before this one's record is written
    # (parallel/pipeline.py). A sink of your own gets each record before the next step is sent.
    passive = False

    _emit: Callable[[int, dict[str, Value]], None]  # a sink written before `emit` was public defines this

    def __init__(self) -> None:
        self.step = 0
        self.closed = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A sink written before `emit` was public defines `_emit`: it is its `emit`.
        super().__init_subclass__(**kwargs)
        if "_emit" in cls.__dict__ and "emit" not in cls.__dict__:
            setattr(cls, "emit", Sink._emit_as_emit)  # noqa: B010 (mypy refuses `cls.emit = ...`)

    def write(self, record: Logs) -> None:
        """What the program's `write(log, record)` calls: the record numbered, as plain values, to `emit`."""
        if self.closed:
            raise ValueError(f"write: the {type(self).__name__} sink is closed")
        values = _plain_record(record)
        self.step += 1
        self.emit(self.step, values)

    @abc.abstractmethod
    def emit(self, step: int, values: dict[str, Value]) -> None:
        """Send one numbered record somewhere; each kind of sink says where. `values` is a new dict
        for each record: the sink may keep it."""

    def _emit_as_emit(self, step: int, values: dict[str, Value]) -> None:
        self._emit(step, values)

    def flush(self) -> None:  # noqa: B027 (a hook: nothing to do unless the sink holds records back)
        """Send on whatever the sink holds back (none of ours holds any record back after its
        `write` returns). Nothing by default."""

    def close(self) -> None:
        """Flush, then refuse further records; closing again does nothing."""
        if not self.closed:
            self.closed = True
            self.flush()

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Stdout(Sink):
    passive = True

    def emit(self, step: int, values: dict[str, Value]) -> None:
        fields = "  ".join(f"{k}={_text(v)}" for k, v in values.items())
        # sys.stdout looked up each time, so pytest's capture and notebooks' redirection work.
        print(f"step {step}  {fields}".rstrip(), file=sys.stdout, flush=True)


class FileSink(Sink):
    """A sink writing a file of its own (`self.file`), each record flushed as it is written: its
    `flush` flushes the file, and its `close` closes it."""

    file: TextIO

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        if not self.closed:
            try:
                super().close()
            finally:
                self.file.close()


class _Jsonl(FileSink):
    passive = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.file: TextIO = open(self.path, "w", encoding="utf-8")  # a new run, a new file

    def emit(self, step: int, values: dict[str, Value]) -> None:
        self.file.write(json.dumps({"step": step, **values}) + "\n")
        self.file.flush()


class _Memory(Sink):
    passive = True

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Value]] = []

    def emit(self, step: int, values: dict[str, Value]) -> None:
        self.records.append(values)


def stdout() -> Sink:
    """Prints `step 1  loss=2.3026` lines."""
    return _Stdout()


def jsonl(path: str | os.PathLike[str]) -> Sink:
    """Writes one JSON object a line, `{"step": 1, "loss": 2.30...}`, flushed each write."""
    return _Jsonl(path)


def memory() -> Sink:
    """Keeps the records (without step numbers) in `.records`."""
    return _Memory()


# -- records held while their values come from a GPU -------------------------------------------------
# Reading a logged value from a GPU waits for the step that made it, and the host then has nothing
# queued for the device. A passive sink's record (its writing reads nothing of the program) whose
# values are on a GPU is held instead: its values start on their way to the host (into pinned memory,
# without waiting), and it is written when the program is next about to change a model (an update,
# ema, load), when a recorded step is about to run, when a record that isn't held is written, or when
# the call from Python ends or raises: by then its step is usually done. So it is written before the
# next step changes anything, and a sink's error ends the loop with the models as that record's step
# left them, as on the CPU and on several devices (parallel/pipeline.py).

HELD_DEVICES = frozenset({"cuda"})  # whose values a record is held for (a test adds "cpu")
HOLD_AT_MOST = 2  # records held at once, where a loop writes several between two updates
_held = threading.local()  # each thread's held records, oldest first: a background run has its own


class _Held:
    """A record whose values are on their way to the host: `done` marks their copies' end, an event a GPU."""

    __slots__ = ("sink", "values", "done")

    def __init__(self, sink: Sink, record: Logs) -> None:
        self.sink = sink
        self.values: dict[str, Any] = {}
        gpus: set[torch.device] = set()
        for name, value in record.values.items():
            if _held_value(value):
                if value.device.type == "cuda":
                    gpus.add(value.device)
                value = value.detach().to("cpu", non_blocking=True)  # into pinned memory: no wait
            self.values[name] = value
        self.done = [torch.cuda.Event() for _ in gpus]  # each GPU's copies on its current stream
        for event, gpu in zip(self.done, gpus):
            event.record(torch.cuda.current_stream(gpu))

    def ready(self) -> bool:
        return all(event.query() for event in self.done)

    def send(self) -> None:
        for event in self.done:
            event.synchronize()
        self.sink.write(Logs(**self.values))


def _held_value(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type in HELD_DEVICES


def write(sink: Sink, record: Logs) -> None:
    """The program's `write(log, record)`: at once, or held (above)."""
    if getattr(sink, "passive", False) and isinstance(record, Logs) and any(map(_held_value, record.values.values())):
        held: list[_Held] | None = getattr(_held, "records", None)
        if held is None:
            held = _held.records = []
        while held and (len(held) >= HOLD_AT_MOST or held[0].ready()):
            _send_first(held)
        held.append(_Held(sink, record))
        return
    send_held()
    sink.write(record)


def send_held() -> None:
    """Write this thread's held records, oldest first. One whose sink raises ends it: the records held
    after it are dropped (their steps came after the failed write, as a loop's end would have it)."""
    held: list[_Held] | None = getattr(_held, "records", None)
    while held:
        _send_first(held)


def _send_first(held: list[_Held]) -> None:
    first = held.pop(0)
    try:
        first.send()
    except BaseException:
        held.clear()
        raise
