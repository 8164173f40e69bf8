"""Progress bars for loops over batches: `for batch in data |> batches(64)` in a program shows a
bar with the loop's batch count as its total.

runtime/data.py's `progress` hook wraps every loop over batches, on one device (`_Batches`) and on
several (`RemoteBatches`, in the controller), when it is set. It is None by default, so scripts,
the command line and the tests loop as they always did; `%load_ext shapescript` in a Jupyter
kernel sets it (magic.py), and anyone may opt in with `enable()` or `with bars(): ...`. The bar is
tqdm.auto's: a widget in Jupyter, a line of text in a terminal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..runtime import data

# Makes a tqdm-like bar: factory(total=..., desc=..., unit=...) with update(n) and close().
BarFactory = Callable[..., Any]


def with_bar(batches: Iterator[Any], count: int, what: str, factory: BarFactory) -> Iterator[Any]:
    """The same batches, with a bar that counts each one the loop has finished with. The bar closes
    when the loop ends, breaks or raises (a generator left behind is closed, so `finally` runs)."""
    bar = factory(total=count, desc=f"{what} batches", unit="batch")
    try:
        for batch in batches:
            yield batch
            bar.update(1)
    finally:
        bar.close()
        close = getattr(batches, "close", None)
        if close is not None:  # stop the loader too, rather than when it is collected
            close()


def _tqdm() -> BarFactory:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise ImportError("progress bars need tqdm: pip install 'shapescript[notebook]' (or pip install tqdm)") from None
    return tqdm


def enable(factory: BarFactory | None = None) -> None:
    """Show a bar for every loop over batches from now on: tqdm.auto's, or `factory`'s."""
    make = factory if factory is not None else _tqdm()
    data.progress = lambda batches, count, what: with_bar(batches, count, what, make)


def disable() -> None:
    """Loops over batches show no bar (the default)."""
    data.progress = None


def enabled() -> bool:
    return data.progress is not None


@contextmanager
def bars(factory: BarFactory | None = None) -> Iterator[None]:
    """Bars for the loops inside the `with` block only; the hook is as it was afterwards."""
    before = data.progress
    enable(factory)
    try:
        yield
    finally:
        data.progress = before
