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


def write(sink: Sink, record: Logs) -> None:
    sink.write(record)
