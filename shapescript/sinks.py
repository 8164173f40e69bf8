"""Where `write(log, logs(...))` sends records: `stdout()`, `jsonl(path)`, `memory()`, `live()`."""

from collections.abc import Sequence

from shapescript.runtime.sinks import Logs, Sink, jsonl, logs, memory, stdout


def live(every: int = 10, fps: float = 10.0, log: bool | str | Sequence[str] = False, smooth: float = 0.0) -> Sink:
    """In a Jupyter notebook, a line chart of each logged number, redrawn as records arrive (at most
    `fps` times a second), its y axis logarithmic with `log=True` (or for the keys named, as
    `log=("loss",)`), its line smoothed by `smooth` (0 to 1, TensorBoard's moving average) over the
    faint values; elsewhere, every `every`-th record printed as stdout() prints it. Keeps every
    record in `.records`, as memory() does."""
    from shapescript.notebook.live import LiveSink  # imported when asked for: ipywidgets only in a kernel
    return LiveSink(every, fps, log, smooth)


__all__ = ["Logs", "Sink", "jsonl", "live", "logs", "memory", "stdout"]
