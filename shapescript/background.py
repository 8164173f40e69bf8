"""Functions run in the background: `h = run(m, opt, data, log, background=True)` returns at once
with a `BackgroundRun` while a thread of the kernel carries out the call, so the notebook stays
usable: reading `m.w1`, the live chart, `%shapescript status` and other calls all work meanwhile,
and each waits for the step in progress to end (runtime/steps.py), so it sees the models as a step
left them. `h.stop()` stops the run at the next step boundary; `h.wait()` gives its result, or
raises its error.

A step is one batch of a loop over batches; a call with no such loop is one step, which `stop()`
can't cut short.
"""

from __future__ import annotations

import contextvars
import enum
import html
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .runtime import steps

_runs: weakref.WeakSet[BackgroundRun] = weakref.WeakSet()  # every run not yet collected

class RunState(enum.StrEnum):
    """A background run's state: running, or ended (finished its loop, stopped by `stop()`, or failed:
    its error is kept). A StrEnum: it reads and prints as its word."""

    RUNNING = "running"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"


RUNNING, FINISHED, STOPPED, FAILED = RunState.RUNNING, RunState.FINISHED, RunState.STOPPED, RunState.FAILED


class BackgroundRun:
    """A call carried out by a thread of its own. `state` is running, finished, stopped (by `stop()`,
    at a step boundary) or failed; `steps` counts the steps ended so far."""

    def __init__(self, name: str, program: Any, call: Callable[[], Any]) -> None:
        self.name = name
        self.program = program  # whose `stop()` stops this run first
        self._control = steps.StepControl()
        self._result: Any = None
        self._error: BaseException | None = None
        self._state = RUNNING
        self._t0 = time.monotonic()
        self._t1: float | None = None
        self._done = threading.Event()
        steps.run_started()  # from here on, other calls from this thread wait for step boundaries
        # The thread runs in a copy of the caller's context: in a Jupyter kernel that holds the cell's
        # message header, so what the run shows (its progress bar, a live chart) goes to the cell
        # that started it, not to whichever cell runs when it is drawn.
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._carry_out, call), daemon=True,
                                        name=f"shapescript-background-{name}")
        _runs.add(self)
        try:
            self._thread.start()
        except BaseException:
            steps.run_ended()
            raise

    def _carry_out(self, call: Callable[[], Any]) -> None:
        steps.carry_out(self._control)
        try:
            self._result = call()
            self._state = FINISHED
        except steps.RunStopped:
            self._state = STOPPED
        except BaseException as e:  # kept for wait(), which raises it in the caller's thread
            self._error, self._state = e, FAILED
        finally:
            steps.carry_out(None)
            steps.run_ended()
            self._t1 = time.monotonic()
            self._done.set()

    # -- asking -------------------------------------------------------------------------------------

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def steps(self) -> int:
        """Steps ended so far, over every loop of the run."""
        return self._control.steps

    @property
    def error(self) -> BaseException | None:
        """The error the run raised, once it has failed."""
        return self._error

    @property
    def seconds(self) -> float:
        """How long it has run (or ran)."""
        return (self._t1 if self._t1 is not None else time.monotonic()) - self._t0

    def progress(self) -> dict[str, Any]:
        """Where the run is: its state, the steps ended, and the current loop's pass and batch."""
        c = self._control
        return {"state": self._state, "steps": c.steps, "pass": c.passes, "batch": c.loop_steps,
                "batches": c.loop_total, "data": c.loop_name, "seconds": round(self.seconds, 3)}

    # -- telling ------------------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> Any:
        """The call's result once it has ended (None if it was stopped); its error, raised here, if it
        failed. TimeoutError if it is still running after `timeout` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"`{self.name}` is still running after {timeout:g} s ({self._where()})")
        if self._error is not None:
            raise self._error
        return self._result

    def stop(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop the run at the next step boundary: the step in progress ends on every device, and the
        models and optimizer state stay as it left them. With `wait` (the default), return once it
        has stopped (TimeoutError after `timeout` seconds)."""
        self._control.stop_asked = True
        if wait and not self._done.wait(timeout):
            raise TimeoutError(f"`{self.name}` hasn't reached a step boundary within {timeout:g} s ({self._where()})")

    # -- showing ------------------------------------------------------------------------------------

    def _where(self) -> str:
        c = self._control
        if c.loop_total is None:
            at = f"{c.steps} steps"
        else:
            pass_text = f", pass {c.passes}" if c.passes > 1 else ""
            at = f"batch {c.loop_steps} of {c.loop_total} ({c.loop_name}{pass_text}), {c.steps} steps in all"
        return f"{at}, {self.seconds:.1f} s"

    def __repr__(self) -> str:
        return f"<{self.describe()}>"

    def describe(self) -> str:
        """"background `fit`: running; batch 12 of 64 (Digit), 12 steps in all, 3.1 s", and so on."""
        state: str = self._state
        if state == FAILED and self._error is not None:
            state = f"failed: {type(self._error).__name__}: {self._error}"
        elif state == STOPPED:
            state = "stopped at a step boundary"
        return f"background `{self.name}`: {state}; {self._where()}"

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(self.describe())}</code>"


def stop_runs_of(program: Any) -> list[BackgroundRun]:
    """Stop `program`'s runs at their next step boundary and wait for them (before its workers stop)."""
    stopped = [run for run in list(_runs) if run.program is program and not run.done]
    for run in stopped:
        run.stop(wait=False)
    for run in stopped:
        run.stop(wait=True)
    return stopped


def running() -> list[BackgroundRun]:
    """The runs going now."""
    return [run for run in list(_runs) if not run.done]
