"""The notebook's widgets: the placement and communication table, and a model with its values on
demand. ipywidgets is imported only here, and only when a widget is made.

A widget shows only in a live frontend (a Jupyter kernel with ipywidgets). What the magic
displays (`Shown`) carries the text and HTML too, so a terminal IPython, nbconvert or a notebook
viewer shows those instead.
"""

from __future__ import annotations

import contextvars
import html
import sys
from types import ModuleType
from typing import Any

from ..runtime.model import leaves
from . import markup as M
from .device_table import DeviceTableView
from .models import AnyModel, model_html, summary

NO_WIDGETS = "the widgets need ipywidgets: pip install 'shapescript[notebook]' (or pip install ipywidgets)"


def ipywidgets() -> ModuleType | None:
    """The ipywidgets module, or None where it isn't installed."""
    try:
        import ipywidgets as widgets
    except ImportError:
        return None
    return widgets


def _require() -> ModuleType:
    widgets = ipywidgets()
    if widgets is None:
        raise ImportError(NO_WIDGETS)
    return widgets


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (whose frontend can draw widgets), not a terminal."""
    ipython = sys.modules.get("IPython")  # a kernel has imported it; a script needn't import it to ask
    if ipython is None:
        return False
    return getattr(ipython.get_ipython(), "kernel", None) is not None


class Shown:
    """A widget with text and HTML beside it: a live frontend draws the widget, a terminal prints
    the text, and a saved notebook's viewer shows the HTML."""

    def __init__(self, widget: Any | None, text: str, html_text: str | None = None) -> None:
        self.widget, self.text, self.html = widget, text, html_text

    def __repr__(self) -> str:
        return self.text

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data: dict[str, Any] = {"text/plain": self.text}
        if self.html is not None:
            data["text/html"] = self.html
        if self.widget is not None:
            view = self.widget._repr_mimebundle_() or {}
            data.update({k: v for k, v in view.items() if k != "text/plain"})  # our text, not the widget's repr
        return data


def update_shown(shown: Any, display_id: str) -> None:
    """Redraw every output showing `display_id` with `shown`, sent as part of the request the kernel
    runs now: from an empty context, ipykernel takes its current request as the message's parent,
    not the one a background run's thread copied from the cell that started it. JupyterLab routes
    an update by its display id alone, but nbclient (`nbconvert --execute`) reads only the running
    cell's messages, and would drop the last drawing of a run a finished cell started."""
    from IPython.display import update_display
    contextvars.Context().run(update_display, shown, display_id=display_id)


def with_html(widget: Any, text: str, html_text: str) -> Any:
    """`widget`, whose display also carries `text` and `html_text`: what nbconvert and a notebook
    viewer show where the widget's state wasn't saved (JupyterLab itself draws the widget's view,
    or its "model not found", whatever else an output holds)."""
    view = widget._repr_mimebundle_

    def bundle(**options: Any) -> dict[str, Any]:
        data = dict(view(**options) or {})
        data.update({"text/plain": text, "text/html": html_text})
        return data

    widget._repr_mimebundle_ = bundle
    return widget


# -- the placement and communication table --------------------------------------------------------

def device_table_widget(table: Any) -> Any:
    """An Accordion, closed, titled "Placement and communication on cpu[0 1] — a batch of 64 splits
    32/32", holding the table as an ipywidgets.HTML. `table` is a DeviceTable (`prog.device_table`),
    a Program, or a DeviceTableView. ImportError without ipywidgets."""
    widgets = _require()
    view = DeviceTableView.of(table)
    body = widgets.HTML(value=M.STYLE + view.table_html())
    accordion = widgets.Accordion(children=[body], titles=(view.title(),))
    accordion.selected_index = None  # closed: a cell's output stays short until asked
    return with_html(accordion, view.text(), view.html())


def show_device_table(view: DeviceTableView) -> Shown:
    """What the magic displays after a cell on several devices: the table's HTML in a closed
    `<details>` panel, and the report's text for a terminal. No ipywidget: a notebook saved without
    the widgets' state (JupyterLab's default) and opened again would show "Error displaying widget:
    model not found" in its place, while HTML shows the same wherever the notebook is opened."""
    return Shown(None, view.text(), view.html())


# -- a model --------------------------------------------------------------------------------------

def model_widget(m: AnyModel) -> Any:
    """The model's table, and below it a dropdown of its params and buffers with a "show values"
    button that fetches the chosen one (for a model on several devices, worker 0's copy) and shows
    its mean, std, min, max and first values. ImportError without ipywidgets."""
    widgets = _require()
    names = [name for name, _ in leaves(m.spec)]
    table = widgets.HTML(value=model_html(m))
    choice = widgets.Dropdown(options=names, description="param", value=names[0] if names else None)
    button = widgets.Button(description="show values", disabled=not names,
                            tooltip="fetch the values (from worker 0 for a model on several devices)")
    values = widgets.HTML(value="")

    def show(_: Any = None) -> None:
        if choice.value is None:
            return
        try:
            text = summary(m, choice.value)
        except Exception as e:
            values.value = f'<pre style="color:#c4161c">{html.escape(f"{type(e).__name__}: {e}")}</pre>'
            return
        values.value = f"<pre>{html.escape(text)}</pre>"

    button.on_click(show)
    return with_html(widgets.VBox([table, widgets.HBox([choice, button]), values]), repr(m), model_html(m))
