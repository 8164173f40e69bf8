"""Progress bars for loops over batches: `for batch in data |> batches(64)` in a program shows a
bar with the loop's batch count as its total.

runtime/loops.py's `progress` hook wraps every loop over batches, on one device (`_Batches`) and on
several (`RemoteBatches`, in the controller), when it is set. It is None by default, so scripts,
the command line and the tests loop as they always did; `%load_ext shapescript` in a Jupyter
kernel sets it (magic.py), and anyone may opt in with `enable()` or `with bars(): ...`.

One bar per loop, not per pass: during one call from Python into a program (`run(m, opt, data,
log)`; loops.call_scope marks it), a loop that runs again (the next epoch) resets its bar and says
which pass it is on, and a second loop in the same call (an evaluation) gets a bar of its own,
keyed by the loop's place in the generated code. A loop inside another loop over batches gets its
own bar too, reused on each pass of the outer one. The bars close when the call ends, so a later
call gets fresh ones. In IPython's main thread they last until the cell ends instead, so that an
epoch loop written in Python (`for n in range(10): epoch(m, opt, log)`) also shows one bar; a later
cell gets fresh ones. A loop iterated from Python outside a call, in a script, gets a bar for that
pass alone.

In Jupyter the bars of a call (or cell) are tqdm.notebook's, shown together in one output, so a
live chart shown meanwhile sits below them, not between them. That output also carries the bars
as HTML and text, written again when each pass ends; when the bars close only those stay, so a
notebook saved without widget state (JupyterLab, nbconvert, GitHub, a viewer) shows the bars at
100%, not as they started.
Elsewhere the bars are tqdm.auto's, lines of text.
"""

from __future__ import annotations

import contextvars
import queue
import sys
import threading
import uuid
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any

from ..runtime import loops, sigint, steps
from . import markup as M

# Makes a tqdm-like bar: factory(total=..., desc=..., unit=...) with update(n), reset(total=...),
# set_description_str(desc), refresh() and close().
BarFactory = Callable[..., Any]


class _Loop:
    """One loop's bar within a call, how many passes it has started, and, between passes, how the
    last one ended (its text and HTML), so that the time a later save reads is the pass's own."""

    def __init__(self) -> None:
        self.bar: Any = None  # made by the bars' first operation for this loop
        self.passes, self.running = 1, True
        self.ended: tuple[str, str] | None = None

    def text(self) -> str:
        """The bar as tqdm prints it ("Digit batches: 100%|██████████| 10/10 [00:01<00:00, ...]")."""
        return self.ended[0] if self.ended else str(self.bar)

    def html(self) -> str:
        """The bar as an HTML <progress> with its description, count and percentage."""
        if self.ended:
            return self.ended[1]
        bar = self.bar
        n, total = bar.n, bar.total
        percent = f" {100 * n / total:.0f}%" if total else ""
        return (f'<div class="ss-bar">{M.esc(bar.desc)}: <progress value="{n}" max="{total or 1}"></progress> '
                f'{n}/{total}{percent} <span class="ss-note">{M.esc(_timing(str(bar)))}</span></div>')


def _timing(meter: str) -> str:
    """tqdm's "[elapsed<remaining, rate]" at the end of a bar's text, or nothing for another bar."""
    return meter[meter.rfind("["):] if meter.endswith("]") and "[" in meter else ""


class _Aside:
    """A background run's bar operations, done in order by a thread of their own: the run takes
    each step holding the step lock (runtime/steps.py), and must not wait on the bars meanwhile
    (tqdm's lock, the kernel's messages), or a reader of `m.w1` would wait on them too. The thread
    runs in the run's context, so the bars go to the cell that started the run. The first error of
    an operation ends the showing (kept in `error`); the run goes on."""

    END_WAIT_S = 2.0  # how long the run's end waits for the last operations (the bars' final state)

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self._ops: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._work,), daemon=True,
                                        name="shapescript-bars")
        self._thread.start()

    def post(self, op: Callable[[], None]) -> None:
        self._ops.put(op)

    def end(self) -> None:
        self._ops.put(None)
        self._thread.join(self.END_WAIT_S)

    def _work(self) -> None:
        while (op := self._ops.get()) is not None:
            if self.error is None:
                try:
                    op()
                except Exception as e:
                    self.error = e


class Bars:
    """The bars of one call: one per loop, keyed by the loop's place in the code. Made by a
    tqdm-like `factory`, whose bars show themselves.

    Every call into the bar library goes through `_ui`: in the thread that gets signals, with Ctrl-C
    held back until it returns (tqdm takes a lock of its own around most of what it does, and a
    KeyboardInterrupt inside would leave it taken: every later bar, the background run's too, would
    wait for it forever); in a background run, on a thread of its own (`_Aside`)."""

    def __init__(self, factory: BarFactory) -> None:
        self.factory = factory
        self.loops: dict[Hashable, _Loop] = {}
        self.runs: list[_Loop] = []  # every loop's bar, in the order made; all close with the call
        self._aside: _Aside | None = None

    def set_aside(self) -> None:
        """Do the bars' work on a thread of their own (see _Aside)."""
        self._aside = _Aside()

    def _ui(self, op: Callable[[], None]) -> None:
        if self._aside is not None:
            self._aside.post(op)
            return
        with sigint.held_back():
            op()

    def loop(self, place: Hashable | None, count: int, what: str) -> _Loop:
        """The bar for a pass of the loop at `place`: its own bar again, reset, after its first pass;
        a new one for a loop first seen (or already running, as in a recursive call)."""
        seen = self.loops.get(place) if place is not None else None
        if seen is None or seen.running:
            made = _Loop()
            self.runs.append(made)
            if place is not None:
                self.loops.setdefault(place, made)

            def make() -> None:
                made.bar = self.factory(total=count, desc=f"{what} batches", unit="batch")
                self.added(made)
            self._ui(make)
            return made
        seen.passes += 1
        seen.running = True
        desc = f"{what} batches, pass {seen.passes}"

        def again() -> None:
            seen.ended = None
            seen.bar.reset(total=count)
            seen.bar.set_description_str(desc, refresh=False)
            seen.bar.refresh()
        self._ui(again)
        return seen

    def step(self, loop: _Loop) -> None:
        """The loop has finished with a batch."""
        self._ui(lambda: loop.bar.update(1))

    def added(self, loop: _Loop) -> None:
        """A new bar (the notebook's puts it beside the others)."""

    def pass_ended(self, loop: _Loop) -> None:
        """A pass is over (done, broken off or failed): its bar shows where it stopped."""
        loop.running = False

        def show() -> None:
            loop.bar.refresh()  # tqdm redraws at most every 0.1 s; the last batches may not show yet
            loop.ended = (loop.text(), loop.html())
            self.save()
        self._ui(show)

    def close(self) -> None:
        def close() -> None:
            for loop in self.runs:
                loop.bar.close()
            self.save(final=True)
            # and let go of them here, so that their __del__ (which closes them again) runs with Ctrl-C
            # held back too: Python drops a KeyboardInterrupt raised in a __del__
            self.loops, self.runs = {}, []
        self._ui(close)
        if self._aside is not None:
            self._aside.end()

    def save(self, final: bool = False) -> None:
        """Write the bars' state where a saved notebook keeps it (the notebook's bars do); `final`:
        they are closed."""

    def text(self) -> str:
        return "\n".join(loop.text() for loop in self.runs)

    def html(self) -> str:
        return '<div class="ss-bars">' + "".join(loop.html() for loop in self.runs) + "</div>"


class NotebookBars(Bars):
    """tqdm.notebook's bars in one ipywidgets.VBox, displayed with the first of them. The display
    carries the bars as HTML and text beside the widget and is updated (by its display id) when a
    pass ends, which is what a saved notebook keeps. When the bars close, the widget leaves the
    output and their HTML and text stay: JupyterLab draws a widget view in preference to the HTML
    beside it, and, in a notebook reopened without the widgets' state, draws "Error displaying
    widget: model not found" instead, where the HTML shows the bars as they ended."""

    def __init__(self) -> None:
        from tqdm.notebook import tqdm as notebook_tqdm

        from .widgets import ipywidgets
        widgets = ipywidgets()
        if widgets is None:
            raise ImportError("notebook progress bars need ipywidgets: pip install 'shapescript[notebook]'")

        def factory(**options: Any) -> Any:  # shown in the box, not each in an output of its own
            return notebook_tqdm(**options, display=False, leave=True)

        super().__init__(factory)
        self.box = widgets.VBox()
        self.display_id: str | None = None

    def added(self, loop: _Loop) -> None:
        self.box.children = (*self.box.children, loop.bar.container)
        self.save()

    def save(self, final: bool = False) -> None:
        from IPython.display import display

        from .widgets import Shown, update_shown
        if not self.runs:  # a loop that never started: nothing to show
            return
        shown = Shown(None if final else self.box, self.text(), self.html())
        if self.display_id is None:
            self.display_id = f"ss-bars-{uuid.uuid4().hex}"
            display(shown, display_id=self.display_id)
        else:
            update_shown(shown, self.display_id)


# -- calls from Python, and cells ----------------------------------------------------------------

class _Calls(threading.local):
    """This thread's call from Python into a program, if one is running (a background run has its own)."""

    def __init__(self) -> None:
        self.depth = 0
        self.bars: Bars | None = None
        self.at_end: dict[int, Callable[[], None]] = {}


_calls = _Calls()


def _cell_scoped() -> bool:
    """Whether this thread's bars last until the cell ends: IPython's main thread, once enable()
    has hooked the cell's end. An epoch loop in Python (`for n in range(10): epoch(m, opt, log)`)
    then reuses one bar, as a loop inside the program does."""
    return _cell_hooked and threading.current_thread() is threading.main_thread()


class CallScope:
    """loops.call_scope: entered around every call from Python (api.Function), counting nested
    calls (a `python fn` calling the program again) so that only the outermost ends the bars."""

    def __enter__(self) -> None:
        _calls.depth += 1

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        calls = _calls
        calls.depth -= 1
        if calls.depth:
            return
        if not _cell_scoped():
            _close_bars()
        ends, calls.at_end = calls.at_end, {}
        for end in ends.values():
            end()


def _close_bars() -> None:
    bars, _calls.bars = _calls.bars, None
    if bars is not None:
        bars.close()


SCOPE = CallScope()
_cell_hooked = False  # whether IPython's post_execute closes the main thread's bars


def track_calls() -> None:
    """Mark each call from Python into a program, so that `at_call_end` can be used."""
    loops.call_scope = SCOPE


def _hook_cells() -> None:
    """In IPython, close the main thread's bars when each cell ends (post_execute runs within the
    cell, so their final state still goes into its output)."""
    global _cell_hooked
    ipython = sys.modules.get("IPython")  # not imported: no shell (and a script needn't have IPython)
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        shell.events.register("post_execute", _close_bars)
        _cell_hooked = True


def at_call_end(key: int, end: Callable[[], None]) -> bool:
    """Run `end` (once per `key`) when this thread's call from Python ends; False if no call is
    running (or calls aren't tracked), so the caller must see to it itself."""
    if loops.call_scope is None or _calls.depth == 0:
        return False
    _calls.at_end.setdefault(key, end)
    return True


# -- the hook -------------------------------------------------------------------------------------

def loop_place(frame: FrameType | None) -> Hashable | None:
    """Where a loop over batches is: the first frame above this library's (the generated code's
    `for` line, or a Python caller's line), as its code and line."""
    while frame is not None and frame.f_globals.get("__name__", "").startswith("shapescript."):
        frame = frame.f_back
    return None if frame is None else (frame.f_code, frame.f_lineno)


def with_bar(batches: Iterator[Any], count: int, what: str, bars: Bars, place: Hashable | None,
             own: bool = False) -> Iterator[Any]:
    """The same batches, counted on the loop's bar as the loop finishes with each. When the pass
    ends, breaks or raises (a generator left behind is closed, so `finally` runs) the bar shows where
    it stopped; with `own`, `bars` belong to this pass alone and close with it."""
    loop = bars.loop(place, count, what)
    try:
        for batch in batches:
            try:
                yield batch
            except GeneratorExit:  # closed by a background run stopped at a step boundary: its step ended
                if (run := steps.current()) is not None and run.stopped:
                    bars.step(loop)
                raise
            bars.step(loop)
    finally:
        bars.pass_ended(loop)
        if own:
            bars.close()
        close = getattr(batches, "close", None)
        if close is not None:  # stop the loader too, rather than when it is collected
            close()


def _hook(make: Callable[[], Bars]) -> Callable[[Iterator[Any], int, str], Iterator[Any]]:
    def progress(batches: Iterator[Any], count: int, what: str) -> Iterator[Any]:
        place = loop_place(sys._getframe(1))
        calls = _calls
        if calls.depth == 0 and not _cell_scoped():  # a loop iterated from Python: a bar for this pass
            return with_bar(batches, count, what, make(), place, own=True)
        if calls.bars is None:
            calls.bars = make()
            if steps.current() is not None:  # a background run's: it must not wait on them
                calls.bars.set_aside()
        return with_bar(batches, count, what, calls.bars, place)
    return progress


def _tqdm() -> BarFactory:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise ImportError("progress bars need tqdm: pip install 'shapescript[notebook]' (or pip install tqdm)") from None
    return tqdm


def _default_bars() -> Callable[[], Bars]:
    """In a Jupyter kernel with ipywidgets, the notebook's bars; elsewhere tqdm.auto's text bars."""
    factory = _tqdm()
    from .widgets import in_kernel, ipywidgets
    if in_kernel() and ipywidgets() is not None:
        return NotebookBars
    return lambda: Bars(factory)


def enable(factory: BarFactory | None = None) -> None:
    """Show a bar for every loop over batches from now on: tqdm.auto's, or `factory`'s."""
    make = _default_bars() if factory is None else (lambda: Bars(factory))
    track_calls()
    _hook_cells()
    loops.progress = _hook(make)


def disable() -> None:
    """Loops over batches show no bar (the default)."""
    loops.progress = None


def enabled() -> bool:
    return loops.progress is not None


@contextmanager
def bars(factory: BarFactory | None = None) -> Iterator[None]:
    """Bars for the loops inside the `with` block only; the hooks are as they were afterwards."""
    before = loops.progress, loops.call_scope
    enable(factory)
    try:
        yield
    finally:
        loops.progress, loops.call_scope = before
