"""Where `write(log, logs(...))` sends records: `stdout()`, `jsonl(path)`, `memory()`."""

from shapescript.runtime.sinks import Logs, Sink, jsonl, logs, memory, stdout

__all__ = ["Logs", "Sink", "jsonl", "logs", "memory", "stdout"]
