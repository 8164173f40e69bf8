"""The several-devices notebook in a real JupyterLab, in a real browser, as a person runs it.

JupyterLab serves a copy of notebooks/ on loopback; Debian's Chromium, driven by Playwright (its
Python package, with our system Chromium: no browser download), opens the several-devices
notebook, runs every cell from the Run menu, and looks for what the person should see: the
placement and communication table, the progress bar of a loop over batches and the timeline of the
calls on the workers. It saves screenshots. Afterwards the server is stopped and no kernel or worker
process may be left.

Needs the `test` extra (jupyterlab, playwright) and Debian's chromium (`apt-get install chromium`;
`make test` installs it when it can).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from support import ROOT

CHROMIUM = os.environ.get("SHAPESCRIPT_CHROMIUM", "/usr/bin/chromium")
NOTEBOOK = "02_several_devices.ipynb"
ARTIFACTS = Path(os.environ.get("SHAPESCRIPT_ARTIFACTS", ROOT / "tests" / "browser" / "artifacts"))
RUN_TIMEOUT_MS = 300_000  # the whole notebook on a loaded 2-core machine, workers' start included


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server on loopback over a copy of notebooks/, isolated from the user's settings."""

    def __init__(self, tmp: Path, notebooks: Path = ROOT / "notebooks") -> None:
        root = tmp / "work"
        shutil.copytree(notebooks, root / "notebooks")
        (root / "examples").symlink_to(ROOT / "examples")  # the notebooks read ../examples
        self.port, self.token = free_port(), secrets.token_hex(16)
        env = {**os.environ,
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
               "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
               "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "ws")}
        news = tmp / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        news.parent.mkdir(parents=True)
        news.write_text('{"fetchNews": "false", "checkForUpdates": false}')  # no popup asking about news
        self.log = (tmp / "lab.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root / 'notebooks'}",
             "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--LabApp.extension_manager=readonly",  # no listing from PyPI: the test needs no network
             *(["--allow-root"] if os.geteuid() == 0 else [])],  # CI runs as root
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_up()

    def _wait_up(self, seconds: float = 90.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"jupyter lab exited with {self.proc.returncode}: {self.log_text()}")
            try:
                urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2).read()
                return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"jupyter lab didn't answer in {seconds} s: {self.log_text()}")

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text()[-4000:]

    def api(self, method: str, path: str) -> Any:
        """The server's REST API: the JSON of `method` on /api/`path` (None where it answers nothing)."""
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            body = answer.read()
        return json.loads(body) if body else None

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> list[psutil.Process]:
        """Stop the server as Ctrl-C would (it shuts its kernels down); the processes it left."""
        children = self.descendants()
        self.proc.send_signal(2)  # SIGINT, twice: Jupyter asks for confirmation after the first
        time.sleep(0.5)
        self.proc.send_signal(2)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        gone, alive = psutil.wait_procs(children, timeout=30)
        for p in alive:
            p.kill()
        self.log.close()
        return alive


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"the browser test needs Debian's Chromium at {CHROMIUM}: `apt-get install chromium` "
                    f"(make test installs it when run as root), or set SHAPESCRIPT_CHROMIUM")
    server = Lab(tmp_path)
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.stop()


@pytest.mark.slow
def test_the_several_devices_notebook_runs_in_jupyterlab(lab: Lab) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            expect(page.get_by_text(re.compile(r"\| Idle$")).first).to_be_visible(timeout=120_000)  # kernel up
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
            _wait_until_done(page)
            # The functions' cell ends with the table in a closed panel: open it.
            title = page.get_by_text(re.compile(r"Placement and communication on cpu\[0 1\].*32/32")).first
            expect(title).to_be_visible(timeout=30_000)
            title.click()
            table = page.locator("table.ss-device-table:visible", has_text="train_step").first
            expect(table).to_be_visible(timeout=30_000)
            assert "813,072" in table.inner_text()  # train_step's bytes per call, from the DeviceTable
            # The loop's bar as it ended: once the cell is done, its HTML stands in for the widget.
            bar = page.locator(".jp-OutputArea .ss-bars progress").first
            expect(bar).to_be_visible(timeout=30_000)
            assert bar.get_attribute("value") == bar.get_attribute("max")
            _assert_tables_aligned(page)
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t]
            assert not tracebacks, tracebacks
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / "several_devices_notebook.png"
            table.scroll_into_view_if_needed()
            page.screenshot(path=str(shot), full_page=False)
            assert shot.stat().st_size > 10_000
            _check_the_timeline(page)
            _check_the_themes(page)
            _check_reopened(page, lab)
        finally:
            browser.close()
    left = lab.stop()
    assert not left, f"processes left after the server stopped: {[p.pid for p in left]}"


def _check_the_timeline(page) -> None:
    """`%shapescript timeline`'s drawing (HTML, redrawn by display updates): a bar per worker, one
    marked slowest, the table of the calls' means; a screenshot of it."""
    from playwright.sync_api import expect

    timeline = page.locator(".jp-OutputArea-output .ss-timeline").first
    drawings = timeline.locator("svg.ss-timeline-bars")  # the latest call of forward, and of train_step
    expect(drawings).to_have_count(2, timeout=30_000)
    for k in range(2):
        expect(drawings.nth(k)).to_be_visible()
        expect(drawings.nth(k).locator("g.ss-timeline-bar")).to_have_count(2)  # a bar per worker
        expect(drawings.nth(k).locator("g.ss-timeline-bar", has_text="slowest")).to_have_count(1)
    text = timeline.text_content() or ""
    assert "`train_step`" in text and "all-reduce" in text and "waiting" in text, text
    timeline.scroll_into_view_if_needed()
    shot = ARTIFACTS / "timeline_widget.png"
    timeline.screenshot(path=str(shot))
    assert shot.stat().st_size > 5_000


# The contrast of each text of our drawings (the timeline's bars, the live charts) with what is behind
# it, as WCAG reckons it: its computed fill over the first background colour found above it.
_CONTRAST_JS = """() => {
    const rgba = text => (text.match(/[\\d.]+/g) || []).map(Number);
    const background = el => {
        for (; el; el = el.parentElement) {
            const [r, g, b, a = 1] = rgba(getComputedStyle(el).backgroundColor);
            if (a > 0) return [r, g, b];
        }
        return [255, 255, 255];
    };
    const luminance = rgb => {
        const [r, g, b] = rgb.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
        return 0.2126 * r + 0.7152 * g + 0.0722 * b;
    };
    return [...document.querySelectorAll("svg.ss-timeline-bars text, svg.ss-chart text")].map(t => {
        const under = background(t.parentElement);
        const [r, g, b, a = 1] = rgba(getComputedStyle(t).fill);
        const fill = [r, g, b].map((v, k) => v * a + under[k] * (1 - a));
        const [hi, lo] = [luminance(fill), luminance(under)].sort((x, y) => y - x);
        return {text: t.textContent, contrast: (hi + 0.05) / (lo + 0.05)};
    });
}"""


def _check_the_themes(page) -> None:
    """The drawings' text reads in JupyterLab's light theme and in its dark one, where SVG text left
    black was black on black: a contrast of at least 4.5 (WCAG's AA) for every
    label, and a screenshot of the timeline in each theme."""
    from playwright.sync_api import expect

    for theme, light in (("JupyterLab Light", "true"), ("JupyterLab Dark", "false")):
        if page.locator(f"body[data-jp-theme-light='{light}']").count() == 0:
            page.get_by_role("menuitem", name="Settings", exact=True).click()
            page.locator(".lm-Menu-item[data-type='submenu']", has_text="Theme").first.hover()
            page.locator(".lm-Menu-item[data-command='apputils:change-theme']", has_text=theme).first.click()
            expect(page.locator(f"body[data-jp-theme-light='{light}']")).to_have_count(1, timeout=30_000)
            page.wait_for_timeout(500)  # the theme's stylesheet applied
        labels = page.evaluate(_CONTRAST_JS)
        assert labels and all(label["contrast"] >= 4.5 for label in labels), (theme, labels)
        timeline = page.locator(".jp-OutputArea-output .ss-timeline").first
        timeline.scroll_into_view_if_needed()
        timeline.screenshot(path=str(ARTIFACTS / f"timeline_{'light' if light == 'true' else 'dark'}.png"))


def _saved(lab: Lab) -> str:
    """The notebook's file as the server reads it, or "" while JupyterLab is still writing it: the
    server then answers 404 (the file moved aside while the new one is written) or 500 (a file cut
    short), as runs of the suite have seen."""
    try:
        return json.dumps(lab.api("GET", f"contents/{NOTEBOOK}"))
    except urllib.error.HTTPError as e:
        if e.code not in (404, 500):
            raise
        return ""


def _check_reopened(page, lab: Lab) -> None:
    """The notebook saved (as JupyterLab saves it by default, without the widgets'
    state), its kernel shut down, and opened again, in a fresh kernel: the table, the bar and the
    timeline show as they ended, and nothing says "Error displaying widget"; a screenshot of it."""
    from playwright.sync_api import expect

    # Saved through the File menu; on a loaded machine a click can land before the menu opens, so the
    # save is asked again every 15 s, until the file holds the timeline (90 s at most).
    deadline, asked = time.monotonic() + 90, 0.0
    while "ss-timeline-bars" not in _saved(lab):
        assert time.monotonic() < deadline, "the notebook wasn't saved with its timeline"
        if time.monotonic() - asked >= 15:
            page.get_by_role("menuitem", name="File", exact=True).click()
            page.locator(".lm-Menu-item[data-command='docmanager:save']").first.click()
            asked = time.monotonic()
        time.sleep(0.5)
    for session in lab.api("GET", "sessions"):
        lab.api("DELETE", f"sessions/{session['id']}")  # the kernel shut down, its widgets' models gone
    page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    expect(page.get_by_text(re.compile(r"\| Idle$")).first).to_be_visible(timeout=120_000)  # a new kernel
    timeline = page.locator(".jp-OutputArea-output .ss-timeline").first
    expect(timeline.locator("svg.ss-timeline-bars")).to_have_count(2, timeout=30_000)
    expect(page.locator(".jp-OutputArea .ss-bars progress").first).to_be_attached()
    expect(page.locator("details table.ss-device-table").first).to_be_attached()
    page.wait_for_timeout(3000)  # the widget manager gives up on a missing model after 2 s
    assert page.get_by_text("Error displaying widget").count() == 0
    timeline.scroll_into_view_if_needed()
    shot = ARTIFACTS / "timeline_reopened.png"
    timeline.screenshot(path=str(shot))
    assert shot.stat().st_size > 5_000


# Each of our tables on the page: whether JupyterLab's rendered-HTML rules reach it, and the computed
# style of a text cell, a figure's cell and a location cell (null where the table has none).
_ALIGNMENT_JS = """() => [...document.querySelectorAll("table[class^=ss-]")].map(t => {
    const style = (selector, property) => {
        const cell = t.querySelector(selector);
        return cell ? getComputedStyle(cell)[property] : null;
    };
    return {table: t.className, jupyter: t.closest(".jp-RenderedHTMLCommon") !== null,
            text: style("td:not(.ss-num)", "textAlign"), figure: style("td.ss-num", "textAlign"),
            location: style("td.ss-nowrap", "whiteSpace")};
})"""


def _assert_tables_aligned(page) -> None:
    """Our tables are left-aligned with right-aligned figures, where JupyterLab's
    `.jp-RenderedHTMLCommon td` rule right-aligns every cell, and the location column doesn't wrap."""
    tables = page.evaluate(_ALIGNMENT_JS)
    assert any(t["jupyter"] for t in tables), f"no table of ours under JupyterLab's rendered HTML: {tables}"
    assert all(t["text"] == "left" for t in tables), tables
    assert any(t["figure"] for t in tables) and all(t["figure"] in (None, "right") for t in tables), tables
    assert any(t["location"] for t in tables) and all(t["location"] in (None, "nowrap") for t in tables), tables


def _wait_until_done(page, seconds: float = RUN_TIMEOUT_MS / 1000) -> None:
    """Until the last code cell has run (Run All goes in order and stops at an error): its prompt
    shows a number, not `[*]` or `[ ]`. Cells scrolled out of view may show no prompt at all."""
    deadline = time.monotonic() + seconds
    prompts = page.locator(".jp-Notebook .jp-CodeCell .jp-InputArea-prompt")
    texts: list[str] = []
    while time.monotonic() < deadline:
        texts = [t.strip() for t in prompts.all_inner_texts()]
        if texts and re.fullmatch(r"\[\d+\]:", texts[-1]) and "[*]:" not in texts:
            return
        time.sleep(1)
    raise AssertionError(f"the notebook didn't finish in {seconds} s: prompts {texts}")


def launch(playwright):
    """Our Chromium, quiet: no sandbox (CI runs as root), no GPU, nothing fetched from the network."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
        "--disable-background-networking", "--disable-component-update"])


_STYLE_ELEMENTS_JS = "() => document.querySelectorAll('.jp-OutputArea-output style').length"


@pytest.mark.slow
def test_a_notebook_opened_untrusted_keeps_the_tables_alignment(tmp_path: Path) -> None:
    """A notebook whose outputs were made elsewhere (not signed, so JupyterLab doesn't trust it)
    shows our tables without their <style> element, which its sanitizer drops: the cells' inline
    styles keep them left-aligned, figures right, locations on one line."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output
    from playwright.sync_api import expect, sync_playwright

    import shapescript as ss
    from shapescript.notebook.device_table import DeviceTableView
    from shapescript.notebook.models import model_html

    program = ss.load(ROOT / "examples" / "readme" / "mlp.ss", devices="cpu[0 1]")  # no workers: nothing runs
    view = DeviceTableView(program.device_table, program.checked.source, lambda line: f"cell [1], line {line}")
    shown = [view.html(open_=True), model_html(ss.load(ROOT / "examples" / "readme" / "mlp.ss", devices="cpu")
                                               .Mlp.init(seed=0))]
    folder = tmp_path / "untrusted"
    folder.mkdir()
    cells = [new_code_cell("ss_program.device_table", execution_count=1, outputs=[
        new_output("display_data", data={"text/html": page, "text/plain": "a table"}) for page in shown])]
    notebook = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                   "language": "python"}})
    nbformat.write(notebook, folder / "untrusted.ipynb")
    lab = Lab(tmp_path, notebooks=folder)
    try:
        with sync_playwright() as p:
            browser = launch(p)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{lab.url}/lab/tree/untrusted.ipynb?token={lab.token}")
                expect(page.locator("table.ss-device-table").first).to_be_attached(timeout=120_000)
                expect(page.locator("table.ss-model-table").first).to_be_attached(timeout=30_000)
                assert page.evaluate(_STYLE_ELEMENTS_JS) == 0, "JupyterLab kept our <style>: the notebook is trusted"
                _assert_tables_aligned(page)
            finally:
                browser.close()
    finally:
        left = lab.stop()
    assert not left, f"processes left after the server stopped: {[p.pid for p in left]}"
