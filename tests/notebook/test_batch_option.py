"""A batch size for the notebook's placement table: where no `batches(n)` gives
one, `%%shapescript --batch N` and `%shapescript comms --batch N` show the shares of a batch of N,
as `shapescript comms --batch N` does on the command line; the hint under a table without one names
the notebook's way, the command line's names `--batch N`; a bad size is a one-line UsageError.

The notebook's figures are checked against the command line's report of the same program, by
`shapescript comms FILE --batch N` (and its --json for the shares)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from support import ROOT
from test_kernel import MLP
from test_session import Notebook, opened

from shapescript.cli import main as cli_main
from shapescript.notebook.device_table import NOTEBOOK_BATCH_HINT, batch_option
from shapescript.notebook.session import PROGRAM_NAME, PROGRAM_VARIABLE
from shapescript.plan.comms_text import CLI_BATCH_HINT

# The README's whole program (its loop has `batches(64)`) on two CPUs, and its functions without the loop.
README = (ROOT / "examples" / "readme" / "mlp.ss").read_text().replace("devices cuda[0 1 2]", "devices cpu[0 1]")
WITHOUT_BATCHES = "devices cpu[0 1]\n\n" + MLP


def command_line(program: str, folder: Path, *options: str) -> str:
    """`shapescript comms notebook.ss OPTIONS`'s output for `program` (the command line's own code,
    in this process), with the file named as the notebook names its program."""
    (folder / PROGRAM_NAME).write_text(program)
    out = io.StringIO()
    with contextlib.chdir(folder), contextlib.redirect_stdout(out):
        assert cli_main(["comms", PROGRAM_NAME, *options]) == 0
    return out.getvalue().rstrip("\n")


@pytest.fixture(scope="module")
def nb() -> Iterator[Notebook]:
    """A notebook with the README's functions on cpu[0 1] and no batches(n) (one per module: each
    starts workers, which take seconds on a loaded machine)."""
    with opened(WITHOUT_BATCHES) as notebook:
        yield notebook


@pytest.mark.parametrize("batch", [7, 64])
def test_the_tables_shares_for_a_batch_are_the_command_lines(nb: Notebook, tmp_path: Path, batch: int) -> None:
    program = nb.ns[PROGRAM_VARIABLE].checked.source  # the notebook's program, as it compiled it
    view = nb.session.device_table_view(batch)
    assert view is not None
    assert view.text() == command_line(program, tmp_path, "--batch", str(batch))
    shares = json.loads(command_line(program, tmp_path, "--batch", str(batch), "--json"))["shares"]
    assert len(shares) == 2 and sum(shares) == batch
    split = "/".join(map(str, shares))
    assert view.title().endswith(f"a batch of {batch} splits {split}")
    assert f"split along b: {split} of {batch}</td>" in view.html()  # the value rows of the HTML table


def test_without_a_batch_size_the_hint_names_the_notebooks_way(nb: Notebook, tmp_path: Path) -> None:
    view = nb.session.device_table_view()
    assert view is not None
    cli_text = command_line(nb.ns[PROGRAM_VARIABLE].checked.source, tmp_path)
    assert f"no batches(n) gives a batch size ({CLI_BATCH_HINT})" in cli_text  # the command line's own flag
    assert CLI_BATCH_HINT not in view.text() and CLI_BATCH_HINT not in view.html()
    assert view.text() == cli_text.replace(CLI_BATCH_HINT, NOTEBOOK_BATCH_HINT)
    assert view.title().endswith(f"no batches(n) gives a batch size ({NOTEBOOK_BATCH_HINT})")
    assert "%%shapescript --batch N" in NOTEBOOK_BATCH_HINT and "%shapescript comms --batch N" in NOTEBOOK_BATCH_HINT
    # From Python: the view with a batch size, checked as the magics check it.
    assert view.with_batch(9).text() == view.with_batch("9").text() == command_line(
        nb.ns[PROGRAM_VARIABLE].checked.source, tmp_path, "--batch", "9")
    for bad in (0, -3, "x", True, 2.5):
        with pytest.raises(ValueError, match=f"positive number of examples, not {bad!r}$"):
            view.with_batch(bad)


@pytest.mark.parametrize("args, said", [
    ("--batch 0", "not 0"), ("--batch -3", "not '-3'"), ("--batch x", "not 'x'"), ("--batch=2.5", "not '2.5'"),
    ("--batch", "got '--batch'"), ("--batch 3 4", "got '--batch 3 4'"), ("--bogus 3", "got '--bogus 3'"),
    ("64", "got '64'")])
def test_a_bad_batch_option_says_what_is_wrong(args: str, said: str) -> None:
    with pytest.raises(ValueError, match="batch") as info:
        batch_option(args)
    assert str(info.value).endswith(said)


def test_the_option_reads_a_size() -> None:
    assert batch_option("") is None and batch_option("  ") is None
    assert batch_option("--batch 64") == 64 and batch_option(" --batch=3 ") == 3


@pytest.fixture
def ip() -> Iterator[InteractiveShell]:
    """An in-process IPython shell with the extension loaded (no kernel: display goes to capture_output)."""
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "shapescript")
    try:
        yield shell
    finally:
        shell.run_line_magic("shapescript", "reset")
        InteractiveShell.clear_instance()  # no shell left for later tests in this process


def test_the_magics_take_a_batch_size(ip: InteractiveShell, tmp_path: Path) -> None:
    """Through the magics, on the README's whole program, whose batches(64) the option overrides."""
    for cell_args in ("--batch 0", "--batch x", "--devices cpu"):
        with pytest.raises(UsageError, match=r"^%%shapescript: .*batch"):
            ip.run_cell_magic("shapescript", cell_args, README)
        assert PROGRAM_VARIABLE not in ip.user_ns  # nothing compiled
    with capture_output() as shown:
        ip.run_cell_magic("shapescript", "--batch 9", README)
    expected = command_line(ip.user_ns[PROGRAM_VARIABLE].checked.source, tmp_path, "--batch", "9")
    [table] = [o for o in shown.outputs if "text/html" in o.data]
    assert table.data["text/plain"] == expected and "a batch of 9 splits 5/4" in table.data["text/html"]
    with capture_output() as shown:
        ip.run_line_magic("shapescript", "comms --batch 9")
    assert [o.data["text/plain"] for o in shown.outputs] == [expected]
    with capture_output() as shown:
        ip.run_line_magic("shapescript", "comms")
    assert shown.outputs[0].data["text/plain"] == command_line(ip.user_ns[PROGRAM_VARIABLE].checked.source, tmp_path)  # its batches(64)
    for line in ("comms --batch -3", "comms --batch x", "comms 12"):
        with pytest.raises(UsageError, match=r"^%shapescript comms: "):
            ip.run_line_magic("shapescript", line)
