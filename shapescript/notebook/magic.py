"""`%load_ext shapescript`: the `%%shapescript` cell magic and the `%shapescript ...` line magics.

A compile error shows its diagnostics as the cell's output (HTML in Jupyter, text in a terminal)
and fails the cell with one short line instead of a traceback (IPython prints an exception's
`_render_traceback_` lines in place of its traceback), so that a notebook run by nbclient stops
there, and nothing of the program or its names has changed. A run-time error of the program raised
in a Python cell shows, the same way, as its message in the cells' terms (report.py).
"""

from __future__ import annotations

import atexit
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from ..api import parse_devices
from ..errors import CompileError, ShapeScriptError, terminal_lines, terminal_text
from ..parallel.interrupts import StepInterrupt
from ..plan.comms import DeviceTable
from . import on_cluster, progress
from .cells import Cell
from .device_table import batch_option
from .models import model_html
from .report import CellCompileError, NotebookError
from .session import CELL_DISCARD, PROGRAM_VARIABLE, Discard, Session
from .timeline import view_for
from .widgets import in_kernel, show_device_table
from .workers import give_back_freed_memory

T = TypeVar("T")
USAGE = f"""\
%%shapescript              compile the cell into the notebook's program; its models, data types and
                           functions become names in the notebook, the Program is `{PROGRAM_VARIABLE}`
%%shapescript --batch N    the same, its placement table showing the shares of a batch of N
%%shapescript --discard    the same, even if a new devices line stops workers that hold models
%shapescript comms         the placement and communication table (--batch N: the shares of a batch of N)
%shapescript devices D     run the program on D: cpu, cuda, cpu[0 1], cuda[0 1 2] (without D: show them);
                           refused while the workers hold models or optimizers, unless --discard
%shapescript cluster A     run the workers on the Ray cluster at A: auto, ray://host:port or host:port
                           (without A: show it, its nodes and their resources; `off`: back to this machine;
                           --discard as for devices)
%shapescript status        the workers: device, pid, memory, and the models and optimizers they hold
%shapescript timeline      where each worker's time goes in the calls on the workers, live
%shapescript stop          stop the workers, losing the models and optimizers on them: refused while
                           there are some, unless --discard (they start again when needed). To stop a
                           run in the background and keep its models: h.stop(), on its handle
%shapescript source        the notebook's whole program, with the line numbers run-time errors give
%shapescript reset         forget every definition and stop the workers
%shapescript explain CODE  the error index's entry for a code, e.g. E0304
%shapescript progress on   show a progress bar for each loop over batches (on in Jupyter; `off` to stop)"""


@magics_class
class ShapeScriptMagics(Magics):
    """The magics, over one `Session` per IPython shell."""

    shell: InteractiveShell  # Magics' may be None; ours is given to __init__

    def __init__(self, shell: InteractiveShell) -> None:
        super().__init__(shell)
        self.session = Session(shell.user_ns)

    @line_cell_magic
    def shapescript(self, line: str, cell: str | None = None) -> None:
        """ShapeScript in the notebook; `%shapescript help` lists the commands."""
        self.session.user_ns = self.shell.user_ns  # the shell's namespace, should %reset have replaced it
        if cell is not None:
            discard, options = _discard_option(line)
            batch = _batch_option(options, "%%shapescript", " (set the devices with a `devices` line in the cell, "
                                  "or with %shapescript devices cpu[0 1])")
            source = Cell(self._cell_label(), f"%%shapescript {line.strip()}".rstrip() + f"\n{cell}", first_line=2)
            _print(self._run(lambda: self.session.run_cell(source, Discard(discard, CELL_DISCARD))))
            self._show_placement(batch)
            return
        command, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        discard, without = _discard_option(rest)
        if command == "devices":
            self._devices(without, discard)
        elif command == "cluster":
            self._cluster(without, discard)
        elif command == "stop" and not without:
            _print(self._run(lambda: self.session.stop(discard)))
        elif command in ("status", "source", "reset") and not rest:
            self._simple(command)
        elif command == "explain" and rest:
            try:
                _print([self.session.explain(rest)], end="")
            except KeyError:
                raise UsageError(f"no error code {rest!r}; codes look like E0304") from None
        elif command == "timeline" and not rest:
            view_for(self.session).show()
        elif command == "progress" and rest in ("on", "off"):
            self._progress(rest == "on")
        elif command == "comms":
            self._comms(_batch_option(rest, "%shapescript comms"))
        elif command in ("", "help"):
            print(USAGE)
        else:
            raise UsageError(f"unknown %shapescript command {line.strip()!r}; the commands are:\n{USAGE}")

    def _devices(self, text: str, discard: bool) -> None:
        if not text:
            program = self.session.program
            print(f"The program runs on {program.devices}." if program is not None else
                  "No program yet: it will run on the devices of its `devices` line, or on cpu.")
            return
        try:
            parse_devices(text)  # a bad spelling is a usage error, before anything changes
        except ValueError as e:
            raise UsageError(terminal_text(str(e))) from None
        _print(self._run(lambda: self.session.set_devices(text, discard)))
        self._show_placement()

    def _cluster(self, address: str, discard: bool) -> None:
        """`%shapescript cluster [ADDRESS | off] [--discard]` (on_cluster.py)."""
        if not address:
            display(on_cluster.view())
            return
        try:
            if address == "off":
                _print(self._run(lambda: on_cluster.disconnect(self.session, discard)))
            else:
                _print(self._run(lambda: on_cluster.connect(self.session, address, discard)))
        except on_cluster.AddressError as e:
            raise UsageError(str(e)) from None

    def _comms(self, batch: int | None) -> None:
        """The program's DeviceTable, opened (its text in a terminal), for a batch of `batch` if given."""
        view = self.session.device_table_view(batch)
        if view is None:
            print("No program yet: run a %%shapescript cell first.")
        else:
            display(view)

    def _show_placement(self, batch: int | None = None) -> None:
        """On several devices, the placement and communication table, as a closed widget."""
        view = self.session.device_table_view(batch)
        if view is not None and view.several and (view.table.fns or view.table.models):  # an empty table says nothing
            display(show_device_table(view))

    @staticmethod
    def _progress(on: bool) -> None:
        if not on:
            progress.disable()
            return
        try:
            progress.enable()
        except ImportError as e:
            raise UsageError(str(e)) from None

    def _simple(self, command: str) -> None:
        if command == "status":
            display(self._run(self.session.status))
        elif command == "source":
            _print([self.session.source()])
        else:
            _print(self._run(self.session.reset))

    @staticmethod
    def _run(action: Callable[[], T]) -> T:
        """`action()`, its ShapeScript errors shown without the extension's frames."""
        try:
            return action()
        except CellCompileError as e:
            display(e.display_object())  # the diagnostics as the cell's output; the error says one line
            raise
        except NotebookError:
            raise
        except ShapeScriptError as e:  # e.g. a WorkerError while the workers load the new program
            raise NotebookError(f"{type(e).__name__}: {e}") from e

    def _cell_label(self) -> str:
        # The count the cell shows as In [n]. IPython 9 has already counted the next cell when this
        # one runs, IPython 8 not yet; the result it fills in has the cell's own count in both.
        result = getattr(self.shell.displayhook, "exec_result", None)
        count = getattr(result, "execution_count", None)
        return f"cell [{count}]" if count is not None else "the cell"


def _discard_option(args: str) -> tuple[bool, str]:
    """Whether a magic's arguments say `--discard`, and the rest of them."""
    words = args.split()
    return "--discard" in words, " ".join(w for w in words if w != "--discard")


def _batch_option(args: str, magic: str, more: str = "") -> int | None:
    """`--batch N` from a magic's arguments (None without it); a UsageError, one line, otherwise."""
    try:
        return batch_option(args)
    except ValueError as e:
        raise UsageError(f"{magic}: {e}{more}") from None


def _print(notes: list[str], end: str = "\n") -> None:
    """Print text that may quote the user's (a name, a source line) as text: a control character in
    it shown as its escape, as the command line shows it."""
    for note in notes:
        print(terminal_lines(note), end=end)


def load_ipython_extension(ip: InteractiveShell) -> None:
    """Register the magics (once per shell: %reload_ext keeps the same program and workers)."""
    magics = ip.magics_manager.registry.get(ShapeScriptMagics.__name__)
    if magics is None:
        magics = ShapeScriptMagics(ip)
        atexit.register(magics.session.shutdown)  # a kernel's exit or restart leaves no worker behind
        _stop_on_shutdown_request(ip, magics.session)
        _show_device_tables(ip, magics.session)
        _show_models(ip)
        _short_runtime_errors(ip, magics.session)
        ip.events.register("post_run_cell", lambda result: give_back_freed_memory())  # workers.py says why
        if in_kernel():  # Jupyter: a bar for each loop over batches (a terminal opts in: %shapescript progress on)
            try:
                progress.enable()
            except ImportError:  # no tqdm: no bars, as before
                pass
    ip.register_magics(magics)


def _stop_on_shutdown_request(ip: InteractiveShell, session: Session) -> None:
    """In Jupyter, stop the workers as the kernel is asked to shut down or restart: ipykernel then
    sends SIGTERM to the kernel's children, our workers, and waits for them to be gone, which they
    never are, unreaped, until the kernel is killed before its exit stops them."""
    kernel = getattr(ip, "kernel", None)
    if kernel is None:
        return
    do_shutdown = kernel.do_shutdown

    def stop_first(restart: bool) -> Any:
        session.shutdown()
        return do_shutdown(restart)

    kernel.do_shutdown = stop_first


def _short_runtime_errors(ip: InteractiveShell, session: Session) -> None:
    """A ShapeScript error raised by a Python cell's call (a ShapeError for a wrong argument), and
    an interrupt that waited for the workers' step (StepInterrupt), show as the message in the
    cells' terms instead of a traceback through the package's frames: the exception gets a
    `_render_traceback_` for that one showing. `%tb`, which shows the same exception again
    (sys.last_value), then shows the whole traceback."""
    show = ip.showtraceback

    def shorter(exc_tuple: Any = None, *args: Any, **kwargs: Any) -> Any:
        error = (exc_tuple or sys.exc_info())[1]
        if (not isinstance(error, (StepInterrupt, ShapeScriptError)) or isinstance(error, CompileError)
                or hasattr(error, "_render_traceback_") or getattr(error, "_shapescript_shown", False)):
            return show(exc_tuple, *args, **kwargs)
        # Attributes no exception class declares, IPython's and ours: in the error's own __dict__.
        marks = vars(error)
        marks["_shapescript_shown"] = True  # the next showing, %tb's, is whole
        # Called by IPython, which falls back to the plain traceback should the lines fail.
        marks["_render_traceback_"] = lambda: session.error_lines(error)
        try:
            return show(exc_tuple, *args, **kwargs)
        finally:
            del marks["_render_traceback_"]
            _say_in_cells(error, session.in_cells)  # for %tb too

    vars(ip)["showtraceback"] = shorter  # in place of the method, on this shell alone


def _say_in_cells(error: BaseException, in_cells: Callable[[str], str]) -> None:
    """The error's message and notes with the program's places said as the cells' lines, for the
    whole traceback that `%tb` shows of it."""
    if error.args and isinstance(error.args[0], str):
        error.args = (in_cells(error.args[0]), *error.args[1:])
    notes = getattr(error, "__notes__", None)
    if isinstance(notes, list):
        notes[:] = [in_cells(n) if isinstance(n, str) else n for n in notes]


def _show_models(ip: InteractiveShell) -> None:
    """A model as a cell's result shows the table of its params: runtime/ and parallel/ know
    nothing of notebooks, so the extension tells IPython how to show their types."""
    from ..parallel.remote import RemoteModel
    from ..runtime.model import Model
    assert ip.display_formatter is not None  # InteractiveShell.__init__ makes it (a trait that allows None)
    html = ip.display_formatter.formatters["text/html"]
    for kind in (Model, RemoteModel):  # for_type covers subclasses: every model class is made per spec
        html.for_type(kind, model_html)


def _show_device_tables(ip: InteractiveShell, session: Session) -> None:
    """`ss_program.device_table` as a cell's result shows the table: its HTML in Jupyter, the
    report's text in a terminal (IPython's formatters, since the DeviceTable is the checker's)."""
    assert ip.display_formatter is not None  # InteractiveShell.__init__ makes it (a trait that allows None)
    formatters = ip.display_formatter.formatters
    formatters["text/html"].for_type(DeviceTable, lambda t: session.view_of(t).html(open_=True))
    formatters["text/plain"].for_type(DeviceTable, lambda t, p, cycle: p.text(session.view_of(t).text()))
