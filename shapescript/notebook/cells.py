"""The notebook's program, accumulated cell by cell.

Each `%%shapescript` cell is parsed on its own to find its top-level items (the devices line, dims,
data types, models, functions) and the lines each one spans. The notebook keeps the latest text of
every item by name; a cell that defines a name again replaces the earlier text, so re-running an
edited cell replaces what it defined. The items are joined into one program, and a line of that
program maps back to the cell, and the cell's own line, it came from.

Nothing here imports IPython or torch: this is plain text bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..syntax import tree as A
from ..syntax.parser import parse

DEVICES = "<devices>"  # the devices line's key: not a name any item can have
PRECISION = "<precision>"  # the precision line's, likewise


@dataclass(frozen=True)
class Cell:
    """What a user ran: `label` names it in messages ("cell [3]"), `source` is its text as shown,
    and the ShapeScript starts at line `first_line` (2 after a `%%shapescript` line)."""

    label: str
    source: str
    first_line: int = 1

    def parse_text(self) -> str:
        """The ShapeScript part, with blank lines in place of the lines before it, so that the
        parser's line numbers are the cell's own."""
        lines = self.source.split("\n")
        return "\n" * (self.first_line - 1) + "\n".join(lines[self.first_line - 1:]) + "\n"


@dataclass(frozen=True)
class Chunk:
    """One top-level item: its key (name, or DEVICES), what it is, and its lines in its cell."""

    key: str
    kind: str  # devices | dim | data | model | fn | extern fn | python fn
    cell: Cell
    first: int  # the cell's line where the item starts (with the comments right above it)
    text: str

    @property
    def line_count(self) -> int:
        return self.text.count("\n") + 1


def _key_and_kind(item: A.Item) -> tuple[str, str]:
    if isinstance(item, A.Devices):
        return DEVICES, "devices"
    if isinstance(item, A.Precision):
        return PRECISION, "precision"
    if isinstance(item, A.Extern):
        return item.name, f"{item.kind} fn"
    kinds: dict[type, str] = {A.Dim: "dim", A.Data: "data", A.Model: "model", A.Fn: "fn"}
    return item.name, kinds[type(item)]


def _last_line(item: A.Item) -> int:
    # A devices line's span ends before its block of options (`shard params`, `split H`).
    if isinstance(item, A.Devices) and item.options:
        return max(item.span.end_line, *(o.span.end_line for o in item.options))
    return item.span.end_line


def split_cell(cell: Cell) -> list[Chunk]:
    """The cell's items in order. Raises CompileError (spans in the cell's own lines) on a syntax error."""
    text = cell.parse_text()
    program = parse(text, cell.label)
    lines = text.split("\n")
    chunks: list[Chunk] = []
    previous_end = 0
    for item in program.items:
        first, last = item.span.line, _last_line(item)
        # Comments right above an item belong to it (they travel with it when it is replaced).
        while first - 1 > previous_end and lines[first - 2].lstrip().startswith("#"):
            first -= 1
        key, kind = _key_and_kind(item)
        chunks.append(Chunk(key, kind, cell, first, "\n".join(lines[first - 1:last])))
        previous_end = last
    return chunks


@dataclass(frozen=True)
class Draft:
    """The whole program as it would be with a cell's items: its text, and where each line came from."""

    chunks: tuple[Chunk, ...]
    starts: tuple[int, ...]  # the program's line where each chunk starts
    source: str

    @classmethod
    def join(cls, chunks: Iterable[Chunk]) -> Draft:
        ordered = sorted(chunks, key=lambda c: c.key != DEVICES)  # the devices line first, as people write it
        starts, parts, line = [], [], 1
        for chunk in ordered:
            starts.append(line)
            parts.append(chunk.text)
            line += chunk.line_count + 1  # a blank line between items
        return cls(tuple(ordered), tuple(starts), "\n\n".join(parts) + "\n")

    def locate(self, line: int) -> tuple[Chunk, int] | None:
        """The chunk holding the program's `line`, and that line's number in the chunk's cell."""
        for chunk, start in zip(self.chunks, self.starts):
            if start <= line < start + chunk.line_count:
                return chunk, chunk.first + (line - start)
        return None


def merge(current: Mapping[str, Chunk], cell_chunks: list[Chunk]) -> tuple[dict[str, Chunk], Draft]:
    """The items after a cell: each of its items replaces the one of the same name, in place. A
    name the cell defines twice stays twice in the draft, so that the checker reports it (E0202)."""
    merged = dict(current)
    seen: set[str] = set()
    doubles: list[Chunk] = []
    for chunk in cell_chunks:
        if chunk.key in seen:
            doubles.append(chunk)
        else:
            seen.add(chunk.key)
            merged[chunk.key] = chunk
    return merged, Draft.join([*merged.values(), *doubles])


def changed_keys(before: Mapping[str, Chunk], after: Mapping[str, Chunk]) -> set[str]:
    """The items whose text differs (or that are new or gone)."""
    return {k for k in before.keys() | after.keys()
            if k not in before or k not in after or before[k].text != after[k].text}
