"""Our tables keep their alignment without their <style> element: JupyterLab's sanitizer drops
<style> from an untrusted output (a notebook reopened from disk) and JupyterLab then right-aligns
every cell, so each cell that holds text carries its own inline text-align (figures right, the rest
left) and a location cell its white-space:nowrap, in properties the sanitizer keeps.

The HTML of the DeviceTable, a model's table and the status table is parsed (html.parser) with
every <style> element removed, as the sanitizer removes it; the browser test (tests/browser) reads
the computed style in a live JupyterLab."""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser

import pytest
from support import ROOT

import shapescript as ss
from shapescript.notebook import markup as M
from shapescript.notebook.device_table import DeviceTableView
from shapescript.notebook.models import model_html
from shapescript.notebook.report import render_rows

README = ROOT / "examples" / "readme" / "mlp.ss"
# The properties of a style attribute that JupyterLab's sanitizer keeps, of those we use (its
# allowedStyles lists them; `style` elements are not among its allowed tags).
KEPT_BY_THE_SANITIZER = {"text-align", "vertical-align", "white-space"}


@dataclass
class Cell:
    tag: str
    classes: set[str]
    style: dict[str, str]
    text: str = ""


class Cells(HTMLParser):
    """Every <td> and <th> of a page, with its classes, inline style and text (a nested cell's text
    counts for the innermost one only)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[Cell] = []
        self.inside: list[Cell] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("td", "th"):
            a = dict(attrs)
            style = dict(part.split(":", 1) for part in (a.get("style") or "").split(";") if part.strip())
            cell = Cell(tag, set((a.get("class") or "").split()), {k.strip(): v.strip() for k, v in style.items()})
            self.cells.append(cell)
            self.inside.append(cell)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.inside:
            self.inside.pop()

    def handle_data(self, data: str) -> None:
        if self.inside:
            self.inside[-1].text += data


def untrusted_cells(page: str) -> list[Cell]:
    """The cells of `page` as JupyterLab shows an untrusted output: without its <style> elements."""
    assert "<style>" in page  # the rule is there for the rest (padding, the notes' colour)
    parser = Cells()
    parser.feed(re.sub(r"<style>.*?</style>", "", page, flags=re.S))
    return [c for c in parser.cells if c.text.strip()]


def assert_aligned_inline(page: str) -> list[Cell]:
    cells = untrusted_cells(page)
    assert cells
    for cell in cells:
        assert set(cell.style) <= KEPT_BY_THE_SANITIZER, cell
        expected = "right" if "ss-num" in cell.classes else "left"
        assert cell.style.get("text-align") == expected, cell
        if cell.classes & {"ss-num", "ss-nowrap"}:
            assert cell.style.get("white-space") == "nowrap", cell
    return cells


@pytest.mark.parametrize("devices", ["cpu[0 1]", "cpu"])
def test_the_device_tables_cells_carry_their_alignment(devices: str) -> None:
    program = ss.load(README, devices=devices)  # the workers start only when something runs
    view = DeviceTableView(program.device_table, program.checked.source, lambda line: f"cell [1], line {line}")
    cells = assert_aligned_inline(view.html(open_=True))
    locations = [c for c in cells if "ss-nowrap" in c.classes]
    assert locations and all(re.fullmatch(r"\d+ cell 1:\d+", c.text) for c in locations)
    figures = [c for c in cells if "ss-num" in c.classes]
    assert any("813,056 bytes" in c.text for c in figures)  # the model's bytes per device, a figure
    assert {"Functions", "Models", "Values"} <= {c.text for c in cells if c.tag == "th"}


def test_a_models_table_carries_its_alignment() -> None:
    m = ss.load(README, devices="cpu").Mlp.init(seed=0)
    cells = assert_aligned_inline(model_html(m))
    figures = [c.text for c in cells if "ss-num" in c.classes]  # each param's bytes, as torch counts them
    assert [f.partition(" bytes")[0] for f in figures] == [f"{t.numel() * t.element_size():,}" for t in (m.w1, m.w2)]


def test_the_status_tables_cells_are_left_aligned_inline() -> None:
    shown = render_rows("ShapeScript workers on cpu[0 1]: running", ["rank", "pid"], [["0", "123"], ["1", "456"]], [])
    parser = Cells()
    parser.feed(shown.html)  # no <style> at all: its alignment is inline only
    assert len(parser.cells) == 6 and all(c.style == {"text-align": "left"} for c in parser.cells)


def test_the_inline_styles_and_the_style_rule_agree() -> None:
    """Trusted, both apply: the <style> rule says the same for each kind of cell."""
    rules = dict(re.findall(r"([^{}]+)\{([^{}]*)\}", M.STYLE.removeprefix("<style>").removesuffix("</style>")))

    def rule(selector: str) -> str:
        return next(body for selectors, body in rules.items() if selector in selectors.split(","))

    assert M.TEXT_CELL in rule("table[class^=ss-] td")
    assert rule("table[class^=ss-] td.ss-num") == M.FIGURE_CELL
    assert rule("table[class^=ss-] td.ss-nowrap") == M.LOCATION_CELL
