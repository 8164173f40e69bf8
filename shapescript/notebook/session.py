"""A notebook's ShapeScript: the program its cells build up, the workers it runs on, and the names
it binds in the notebook. The magics (magic.py) are a thin layer over this class, which doesn't
import IPython, so that it can be driven and tested without a kernel.

Each change (a cell, a new devices line) compiles the whole program first and changes nothing when
that fails; only then does it move the workers, replace the program and rebind the names.
"""

from __future__ import annotations

import warnings
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from ..api import Program, load, parse_devices
from ..codes import explain
from ..errors import CompileError, ShapeError, ShapeScriptError, SourceWarning, Span, worker_places
from ..parallel.pool import WorkerPool
from ..parallel.remote import RemoteModel
from ..plan.comms import DeviceTable
from ..runtime import model as model_module
from ..runtime.model import Model, ModelSpec
from ..shapes.kinds import FnKind
from ..stale import name_holders, read_refusal, stale_notes
from .cells import Cell, Chunk, Draft, changed_keys, merge, split_cell
from .device_table import DeviceTableView
from .report import CellCompileError, CellPlaces, Located, NotebookError, Rich, locate, locate_all, runtime_error_lines
from .workers import ask_workers, describe_loss, held_objects, measured_memory, pool_of, status_table

PROGRAM_NAME = "notebook.ss"  # the file name run-time messages give the notebook's program
PROGRAM_VARIABLE = "ss_program"  # the notebook's name for the Program
CELL_DISCARD = "`%%shapescript --discard` as the cell's first line"


@dataclass(frozen=True)
class Discard:
    """Whether a change may stop workers that hold models or optimizers (`yes`), and, where it may
    not, how the person says it may (`how`, for the message that refuses it)."""
    yes: bool
    how: str


_MISSING = object()


def _is_model(value: Any) -> bool:
    return isinstance(value, (Model, RemoteModel))


class Session:
    """The notebook's program, built from its cells. `user_ns` is the namespace to bind names in."""

    def __init__(self, user_ns: MutableMapping[str, Any]) -> None:
        self.user_ns = user_ns
        self.items: dict[str, Chunk] = {}  # the latest text of each item, by name, in first-defined order
        self.program: Program | None = None
        self.bound: dict[str, Any] = {}  # the names this session bound, and to what
        # every model type's spec of every program the cells made, by id (held, so no id is reused),
        # and those found to fit the current program: a read of a model whose type a later cell
        # reshaped is refused, as a call is (runtime/model.py's read_check)
        self._specs: dict[int, ModelSpec] = {}
        self._fitting: dict[int, ModelSpec] = {}
        model_module.read_check = self._check_read

    # -- changing the program --------------------------------------------------------------------

    def run_cell(self, cell: Cell, discard: Discard | None = None) -> list[str]:
        """Compile the program with `cell`'s items; notes to show. Raises CellCompileError and
        changes nothing if the program doesn't compile, and NotebookError if it would stop workers
        that hold models or optimizers, unless `discard` says they may go."""
        try:
            chunks = split_cell(cell)
        except CompileError as e:  # a syntax error: its spans are already the cell's own lines
            raise CellCompileError([Located(d, cell) for d in e.diagnostics], cell.source, cell.label) from None
        items, draft = merge(self.items, chunks)
        try:
            with warnings.catch_warnings():  # its warnings are said below, in the cells' terms
                warnings.simplefilter("ignore", SourceWarning)
                program = load(draft.source, name=PROGRAM_NAME)
        except CompileError as e:
            raise CellCompileError(locate_all(e, draft, PROGRAM_NAME), draft.source, cell.label) from None
        except ValueError as e:  # checked, but the Python API refuses it
            raise NotebookError(f"The program compiles, but the Python API can't build it: {e}") from None
        # This cell's warnings (W0106); an earlier cell's were shown when it ran.
        located = [locate(w, draft, PROGRAM_NAME) for w in program.checked.warnings]
        said = [x.text(draft.source) for x in located if x.cell is cell]
        return said + self._commit(program, items, {c.key for c in chunks}, discard or Discard(False, CELL_DISCARD))

    def set_devices(self, text: str, discard: bool = False) -> list[str]:
        """`%shapescript devices cpu[0 1]`: the program's devices line becomes this one. ValueError
        if `text` isn't a devices spelling; NotebookError, changing nothing, if that would stop
        workers holding models or optimizers, unless `discard`."""
        devices = parse_devices(text)
        return self.run_cell(Cell("%shapescript devices", f"devices {devices}"),
                             Discard(discard, f"`%shapescript devices {devices} --discard`"))

    def _commit(self, program: Program, items: dict[str, Chunk], defined: set[str], discard: Discard) -> list[str]:
        changed = changed_keys(self.items, items)
        kinds = {k: c.kind for k, c in (*self.items.items(), *items.items())}
        notes = self._move_workers(program, keep_datasets=not any(kinds[k] in ("data", "dim") for k in changed),
                                   discard=discard)
        notes += self._stale_models(changed, kinds)
        # models whose type a changed dim (or sub-model) reshaped: said now, refused at their next call
        notes += stale_notes(program, dict(self.user_ns), _is_model, skip={k for k in changed if kinds[k] == "model"},
                             before=self.program)
        name_holders(program, self._holders_of)
        self.items, self.program = items, program
        self._specs.update((id(v), v) for k, v in program.namespace.items() if k.endswith("_spec")
                           and isinstance(v, ModelSpec))
        self._fitting = {}
        self._bind(program, defined)
        return notes

    def _move_workers(self, program: Program, keep_datasets: bool, discard: Discard) -> list[str]:
        """The old program's workers go to the new one if the devices are the same; otherwise they
        stop (saying what dies with them; refused if that is a model, unless `discard`) and, on
        several devices, new ones start."""
        if self.program is not None and program.adopt_workers(self.program, keep_datasets):
            return []
        notes = self.stop_workers(f"the program now runs on {program.devices}", discard)
        return notes + self.start_workers(program)

    def stop_workers(self, why: str, discard: Discard) -> list[str]:
        """Stop the workers, saying what goes with them (nothing to say if none run). NotebookError,
        and nothing stops, if they hold models or optimizers and `discard` doesn't let them go."""
        pool = pool_of(self.program)
        if pool is None:
            return []
        if not discard.yes:
            self._refuse_to_lose(pool, discard.how)
        return [self._stop_workers(why)]

    def _refuse_to_lose(self, pool: WorkerPool, how: str) -> None:
        """NotebookError if the workers hold a model or an optimizer (datasets are sent again)."""
        answers = ask_workers(pool, where="what stopping the workers would lose")
        held = held_objects(pool, self.user_ns, answers, getattr(self.program, "datasets", None))
        live = [h for h in held if h.what.endswith((" model", " optimizer"))]
        if live:
            raise NotebookError(
                f"The workers on {pool.devices} hold {', '.join(map(str, live))}: stopping them would lose "
                f"{'it' if len(live) == 1 else 'them'}, so nothing has changed. Save what you need first "
                f"(ss.save(path, m, opt)), then {how} stops them anyway. (To stop a run in the background "
                f"and keep its models, use its handle: h.stop().)")

    @staticmethod
    def start_workers(program: Program | None) -> list[str]:
        """On several devices, start `program`'s workers in the background, where workers now start
        (this machine, or the current cluster); what happened, to show."""
        if program is None or not program.several:
            return []
        try:
            program.workers(background=True)  # the first call waits for them
            return [f"Starting workers on {program.devices} in the background."]
        except ShapeScriptError as e:  # can't even spawn them: the program retries when it needs them
            return [f"The workers on {program.devices} couldn't be started: {e}"]

    def _stale_models(self, changed: set[str], kinds: dict[str, str]) -> list[str]:
        """A note for each changed model type that the notebook holds models of."""
        notes = []
        for name in sorted(k for k in changed if kinds[k] == "model" and k in self.items):
            holders = [n for n, v in list(self.user_ns.items()) if not n.startswith("_")
                       and _is_model(v) and v.spec.name == name]
            if holders:
                were = "was" if len(holders) == 1 else "were"
                notes.append(f"model {name} changed: {', '.join(holders)} {were} made from its old definition; "
                             f"make new models with {name}.init(seed=...).")
        return notes

    def _check_read(self, spec: ModelSpec, member: str) -> None:
        """A ShapeError if `spec` is one of the cells' model types and the current program's type of
        that name has other shapes now."""
        program = self.program
        if program is None or id(spec) not in self._specs or id(spec) in self._fitting:
            return
        refused = read_refusal(spec, member, program)
        if refused is not None:
            raise ShapeError(refused)
        self._fitting[id(spec)] = spec

    def _holders_of(self, value: Any) -> list[str]:
        """The notebook's variables that hold `value`."""
        return [n for n, v in list(self.user_ns.items()) if v is value and not n.startswith("_")]

    def _bind(self, program: Program, defined: set[str]) -> None:
        """Bind the program's models, data types and functions by name. A name the user has since
        given another value keeps it, unless this cell defines it again; names of ours that the
        program no longer has go."""
        names = program.names
        bound: dict[str, Any] = {}
        for name in names:
            current = self.user_ns.get(name, _MISSING)
            if name in defined or current is _MISSING or current is self.bound.get(name, _MISSING):
                self.user_ns[name] = bound[name] = getattr(program, name)
        self._unbind(keep=bound)
        self.bound = bound
        self.user_ns[PROGRAM_VARIABLE] = program

    def _unbind(self, keep: dict[str, Any]) -> None:
        for name, value in self.bound.items():
            if name not in keep and self.user_ns.get(name, _MISSING) is value:
                del self.user_ns[name]

    # -- the workers and the rest ----------------------------------------------------------------

    def status(self) -> Rich:
        table = status_table(self.program, self.user_ns)
        return Rich(self.in_cells(table.text), self.in_cells(table.html))

    def stop(self, discard: bool = False) -> list[str]:
        """Stop the workers, saying what they held; refused while they hold models or optimizers,
        unless `discard`."""
        if pool_of(self.program) is None:
            return ["No workers are running."]
        notes = self.stop_workers("%shapescript stop", Discard(discard, "`%shapescript stop --discard`"))
        return notes + ["They start again when the program next needs them."]

    def reset(self) -> list[str]:
        """Forget every definition and stop the workers."""
        notes = [self._stop_workers("%shapescript reset")] if pool_of(self.program) is not None else []
        self._unbind(keep={})
        if self.user_ns.get(PROGRAM_VARIABLE, _MISSING) is self.program:
            del self.user_ns[PROGRAM_VARIABLE]
        self.items, self.program, self.bound = {}, None, {}
        return notes + ["The notebook's ShapeScript program is empty."]

    def _stop_workers(self, why: str) -> str:
        pool, program = pool_of(self.program), self.program
        assert pool is not None and program is not None
        note = describe_loss(pool, self.user_ns, why, getattr(program, "datasets", None))
        program.stop()
        return note

    def shutdown(self) -> None:
        """At the kernel's exit: stop the workers without a word."""
        if self.program is not None:
            self.program.stop()

    def source(self) -> str:
        """The notebook's program as compiled, with its line numbers (run-time messages give them, as
        notebook.ss:12:5) and the cell each item came from."""
        if not self.items:
            return "The notebook's ShapeScript program is empty."
        draft = Draft.join(self.items.values())
        lines = draft.source.rstrip("\n").split("\n")
        width = len(str(len(lines)))
        starting = dict(zip(draft.starts, draft.chunks))
        out = [f"{PROGRAM_NAME}, the notebook's program (each item as the cell that last defined it has it):"]
        for number, text in enumerate(lines, 1):
            chunk = starting.get(number)
            if chunk is not None:
                cell = chunk.cell
                origin = cell.label if cell.label.startswith("%") else f"{cell.label}, line {chunk.first}"
                out.append(f"{'':>{width}} | # from {origin}")
            out.append(f"{number:>{width}} | {text}".rstrip())
        return "\n".join(out)

    def error_lines(self, error: BaseException) -> list[str]:
        """A run-time error as the notebook shows it: its places in the program ("notebook.ss:12:5")
        said as the cells and their lines, as `source()` maps them."""
        program = self.program
        calls = program.locate(error) if program is not None else []  # its generated frames
        failed_at = None
        if program is not None:
            calls += [(name, Span(program.checked.file, line, col, line, col + 1))  # and a worker's
                      for name, line, col in worker_places(error)]
            # the caret: the line that failed, in the innermost fn of the program's own (an extern
            # fn's frame is at its declaration, and the Python it calls failed)
            ours = [span for name, span in calls if (info := program.checked.fns.get(name)) and info.kind == FnKind.FN]
            failed_at = ours[-1] if ours else None
        return runtime_error_lines(error, Draft.join(self.items.values()), PROGRAM_NAME, calls, failed_at)

    def in_cells(self, text: str) -> str:
        """`text` with each place of the program ("notebook.ss:12:5") said as the cell and its line."""
        return CellPlaces(Draft.join(self.items.values()), PROGRAM_NAME)(text)

    def device_table_view(self, batch: int | None = None) -> DeviceTableView | None:
        """The program's DeviceTable with its text and each line's cell, with the shares of a batch of
        `batch` if given (`%shapescript comms --batch N`); None before the first cell."""
        program = self.program
        if program is None:
            return None
        draft = Draft.join(self.items.values())  # the compiled program's text, as source() shows it

        def place(line: int) -> str | None:
            found = draft.locate(line)
            return f"{found[0].cell.label}, line {found[1]}" if found is not None else None

        measured = tuple(measured_memory(program, "the DeviceTable"))  # () unless the workers are running
        return DeviceTableView(program.device_table, program.checked.source, place, measured, batch)

    def view_of(self, table: DeviceTable) -> DeviceTableView:
        """A DeviceTable as the notebook shows it: the program's with its text and cells, another as it is."""
        view = self.device_table_view()
        return view if view is not None and view.table is table else DeviceTableView.of(table)

    @staticmethod
    def explain(code: str) -> str:
        """The error index's entry; KeyError for an unknown code."""
        return explain(code)
