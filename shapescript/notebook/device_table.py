"""The DeviceTable (plan/comms.py) as the notebook shows it: a title, an HTML table and text.

Every figure and sentence comes from the table through plan/comms_text.py's formatters, so the
notebook says what `shapescript comms` and the editor's hovers say; nothing here looks at the
checker. The HTML has one row per function (where it runs, what one call sends), per model (its
bytes on each device), per value (how it lies on the devices) and per line that sends (its source
and each collective). The text is
`shapescript comms`'s report. Nothing here imports IPython or ipywidgets (widgets.py does).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import sympy

from ..check.program import Checked
from ..errors import terminal_lines
from ..parallel.memory import WorkerMemory
from ..plan.choice_text import choice_lines, cost_text
from ..plan.comms import DeviceTable, device_table
from ..plan.comms_text import (
    first_values,
    fn_text,
    hosts_note,
    item_lines,
    layout_text,
    sum_bytes,
    table_report,
    value_text,
)
from ..plan.records import FnPlan, Layout
from ..plan.sizes_text import bytes_text
from ..shapes.plans import Where
from . import markup as M
from .report import _inline_code
from .workers import short_bytes

if TYPE_CHECKING:
    from ..api import Program

# How fn_text words a placement, for the table's short "where it runs" column.
_PLACES = {Where.CONTROLLER: "in the controller", Where.WORKERS: "on the workers"}

# The notebook's ways to give the table a batch size where no `batches(n)` does (the command line's
# is `shapescript comms --batch N`, comms_text.CLI_BATCH_HINT).
NOTEBOOK_BATCH_HINT = "%%shapescript --batch N or %shapescript comms --batch N shows the shares"


def batch_size(value: object) -> int:
    """A batch size for the table's shares: a positive whole number, given as one or as its digits.
    ValueError, naming the value, for anything else (0, -3, "x")."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"the batch size for the shares must be a positive number of examples, not {value!r}")
    return value


def batch_option(args: str) -> int | None:
    """The batch size a magic's arguments give (`--batch 64` or `--batch=64`), None if they give
    none; ValueError for any other argument or a bad size."""
    words = args.replace("=", " ").split()
    if not words:
        return None
    if len(words) != 2 or words[0] != "--batch":
        raise ValueError(f"the only option is --batch N, the batch size for the shares; got {args.strip()!r}")
    return batch_size(words[1])


@dataclass(frozen=True)
class DeviceTableView:
    """A DeviceTable with the program text its line numbers refer to, and (in the notebook) a way to
    name a line by the cell it came from. `_repr_html_` and `__repr__` show it anywhere."""

    table: DeviceTable
    source: str = ""  # the program's text, for the source of the lines that send ("" if unknown)
    place: Callable[[int], str | None] | None = None  # "cell [2], line 7" for a program's line
    measured: tuple[WorkerMemory, ...] = ()  # what the running workers measured (parallel/memory.py)
    batch: int | None = None  # the batch size to show the shares for, in place of the program's batches(n)

    @classmethod
    def of(cls, thing: DeviceTable | Checked | Program | DeviceTableView) -> DeviceTableView:
        """The view of a DeviceTable, or of a Checked or Program's table (with its source)."""
        if isinstance(thing, DeviceTableView):
            return thing
        checked = getattr(thing, "checked", thing)  # a Program holds its Checked
        if isinstance(checked, Checked):
            return cls(device_table(checked), checked.source)
        if isinstance(thing, DeviceTable):
            return cls(thing, _file_text(thing.file))
        raise TypeError(f"expected a DeviceTable (prog.device_table) or a Program, got {type(thing).__name__}")

    def with_batch(self, batch: object) -> DeviceTableView:
        """The same table, with the shares of a batch of `batch` (`shapescript comms --batch N`);
        ValueError unless it is a positive whole number."""
        return dataclasses.replace(self, batch=batch_size(batch))

    @property
    def several(self) -> bool:
        return self.table.count > 1

    def title(self) -> str:
        """As "Placement and communication on cpu[0 1] — a batch of 64 splits 32/32"; on several hosts,
        with the devices in all and on each after the line: "on 2 x cpu[0 1] (4 devices: 2 hosts × 2)"."""
        t = self.table
        if not self.several:
            return f"Placement on {t.devices}: one device, nothing is sent between devices"
        parts = t.shares_text(self.batch)
        size = self.batch if self.batch is not None else t.batch
        split = (f"a batch of {size} splits {parts}" if parts else
                 f"no batches(n) gives a batch size ({NOTEBOOK_BATCH_HINT})")
        hosts = f" ({t.count} devices: {t.hosts} hosts × {t.per_host})" if t.crosses_hosts else ""
        return f"Placement and communication on {t.devices}{hosts} — {split}"

    def text(self) -> str:
        """`shapescript comms`'s report of the table, and what the workers measured if they did."""
        text = table_report(self.table, self.table.file or "the program", self.source, self.batch, NOTEBOOK_BATCH_HINT)
        notes = [f"- `{name}`: {note.removeprefix('measured: ')}" for name in self.table.models
                 if (note := self.measured_note(name))]
        return text + "".join(f"\n{line}" for line in ["", "Measured on the workers:", *notes]) if notes else text

    def measured_note(self, model: str) -> str:
        """"measured: 794 KiB per device; peak 329 MiB per device in the last call, ..." once the
        workers have run a call holding a model of this type; "" otherwise (the static table)."""
        holding = [w for w in self.measured if model in w.model_bytes]
        calls = [w.last for w in holding if w.last is not None]
        if not calls:
            return ""
        held = sorted({w.model_bytes[model] for w in holding})
        size = short_bytes(held[0]) if len(held) == 1 else f"{short_bytes(held[0])} to {short_bytes(held[-1])}"
        return (f"measured: {size} per device; peak {short_bytes(max(c.peak for c in calls))} per device in "
                f"the last call, {calls[0].what} ({short_bytes(max(c.added for c in calls))} of it added by the call)")

    def __repr__(self) -> str:
        return terminal_lines(self.text())  # its source lines are user text

    def _repr_html_(self) -> str:
        return self.html(open_=True)

    def html(self, open_: bool = False) -> str:
        """The title, and the table below it in a `<details>` (open or not)."""
        return (f"{M.STYLE}<details{' open' if open_ else ''}><summary><b>{M.esc(self.title())}</b></summary>"
                f"{self.table_html()}</details>")

    def table_html(self) -> str:
        """`<table class="ss-device-table">`: functions, models, then the lines that send."""
        rows = self._choice_rows()
        rows += [M.section("Functions", 4), M.header(["line", "function", "where it runs", "sent per call"])]
        rows += [self._fn_row(f) for f in self.table.fns.values()]
        if self.table.models:
            rows += [M.section("Models", 4), M.header(["line", "model", "layout", "bytes per device"])]
            rows += [self._model_row(m) for m in self.table.models.values()]
        values = first_values(self.table)
        if values:
            rows += [M.section("Values", 4), M.header(["line", "value", "layout", "bytes"])]
            rows += [self._value_row(v) for v in values]
        if self.several:
            rows += [M.section("Lines that send", 4), M.header(["line", "source", "collectives", "in all"])]
            if self.table.crosses_hosts:  # each collective below is marked too
                rows.append(M.row(["", M.esc(hosts_note(self.table) + "."), "", ""], cls="ss-hosts"))
            rows += [self._line_row(n) for n in sorted(self.table.lines)]
            if not self.table.lines:
                rows.append(M.row(["", "none: nothing is sent between the devices", "", ""]))
        return M.table("ss-device-table", rows)

    # -- rows ------------------------------------------------------------------------------------

    def _choice_rows(self) -> list[str]:
        """`layout auto`'s choice first, then every other layout weighed: its bytes a step, its
        memory a device, and whether it fits (plan/choice_text.py words each)."""
        choice = self.table.choice
        if choice is None:
            return []
        lines = choice_lines(choice)
        rows = [M.section("Layout chosen by `layout auto`", 4), M.row(["", M.esc(lines[1].strip()), "", ""]),
                M.header(["", "layout", "", "a step sends, a device holds"])]
        for c in (choice.chosen, *[c for c in choice.costs if c is not choice.chosen]):
            how = "chosen" if c is choice.chosen else "fits" if c.fits(choice.budget) else \
                "refused" if c.refused else "too big"
            rows.append(M.row(["", M.code(c.layout), how, M.esc(cost_text(c))], cls=f"ss-layout-{how.replace(' ', '-')}"))
        return rows

    def _line_cell(self, line: int) -> str:
        """The program's line and, in the notebook, its cell: `6 cell 2:3`, on one line (the row
        puts it in a `nowrap` column), with the full "cell [2], line 3" as its tooltip."""
        where = self.place(line) if self.place is not None else None
        if not where:
            return str(line)
        return f'{line} <span class="ss-note" title="{M.esc(where)}">{M.esc(compact_place(where))}</span>'

    def _fn_row(self, f: FnPlan) -> str:
        where = _PLACES.get(f.placement, "anywhere") + (f": it {f.reason}" if f.reason else "")
        return M.row([self._line_cell(f.span.line), M.code(f.name), M.esc(where), M.esc(self._per_call(f))],
                     cls="ss-fn", numeric=[3], nowrap=[0], title=fn_text(self.table, f))

    def _per_call(self, f: FnPlan) -> str:
        # As fn_text says it: a controller's function, or one device, has no figure of its own.
        if not self.several or f.placement == Where.CONTROLLER:
            return "—"
        if not f.sent and not f.sent_differentiated:
            return "nothing"
        text = bytes_text(f.bytes)
        if f.differentiated and f.sent_differentiated != f.sent:
            text += f"; {bytes_text(sum_bytes(f.sent_differentiated))} under value_and_grad"
        return text

    def _model_row(self, m: Layout) -> str:
        layout = layout_text(self.table, m, self.batch) if self.several else f"on {self.table.devices}"
        size = bytes_text(m.bytes) if m.bytes is not None else "?"
        measured = self.measured_note(m.name)  # once the workers ran a call: what they hold, and its peak
        layout_cell = M.esc(layout) + (M.note(measured) if measured else "")
        return M.row([self._line_cell(m.span.line), M.code(m.name), layout_cell, M.esc(size)],
                     cls="ss-model", numeric=[3], nowrap=[0], title=value_text(self.table, m, self.batch))

    def _value_row(self, v: Layout) -> str:
        name = f"{M.code(v.name)}: {M.esc(v.type)}<div class=\"ss-note\">in {M.code(v.fn or '')}</div>"
        if v.per_example is not None:
            size = f"{bytes_text(v.per_example)} per example"
        else:
            size = bytes_text(v.bytes) if v.bytes is not None else ""
        layout = layout_text(self.table, v, self.batch)
        return M.row([self._line_cell(v.span.line), name, M.esc(layout), M.esc(size)],
                     cls="ss-value", numeric=[3], nowrap=[0], title=value_text(self.table, v, self.batch))

    def _line_row(self, line: int) -> str:
        items = self.table.line(line)
        sends = [text.removeprefix("- ") for item in items for text in item_lines(self.table, item)]
        listed = "<ul>" + "".join(f"<li>{_inline_code(s)}</li>" for s in sends) + "</ul>"
        total = bytes_text(sympy.Add(*(i.bytes for i in items)))
        return M.row([self._line_cell(line), M.code(self._source_line(line)), listed, M.esc(total)],
                     cls="ss-line", numeric=[3], nowrap=[0])

    def _source_line(self, line: int) -> str:
        lines = self.source.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""


# How session.py names a line of a Jupyter cell: "cell [3], line 2".
_CELL_LINE = re.compile(r"cell \[(?P<cell>[^\]]+)\], line (?P<line>\d+)")


def compact_place(where: str) -> str:
    """"cell [3], line 2" as the table's short "cell 3:2"; any other place (a magic's) as it is."""
    found = _CELL_LINE.fullmatch(where)
    return f"cell {found['cell']}:{found['line']}" if found else where


def _file_text(file: str) -> str:
    """A table's program text when only the table is at hand: its file's, if it is one (a program
    loaded from a path); "" for a program given as text."""
    try:
        return Path(file).read_text() if file.endswith(".ss") else ""
    except OSError:
        return ""
