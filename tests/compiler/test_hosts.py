"""Devices on several hosts, `devices 2 x cuda[0 1 2 3]`: parsed (with `x` or `×`), checked as
hosts × devices workers, marked in the DeviceTable as crossing hosts, and refused at run time
without a cluster. Each multi-host figure is compared with the same program on one host with as
many devices: only the hosts' marking may differ."""

from __future__ import annotations

import json
import re

import pytest
import torch
from programs import README_FILE

import shapescript as ss
from shapescript.api import parse_devices
from shapescript.devices import DeviceSet
from shapescript.errors import ClusterNeededError
from shapescript.notebook.cells import Cell
from shapescript.notebook.device_table import DeviceTableView
from shapescript.notebook.session import Session
from shapescript.pipeline import check_source
from shapescript.plan.comms import device_table
from shapescript.plan.comms_text import CROSSES_HOSTS, line_text, report, to_json
from shapescript.syntax import tree as A
from shapescript.syntax.parser import parse

HEADS = "dim H = 12\ndim Dh = 4\n\nfn f(x: [n H Dh]) -> [n H Dh] = x * 2.0\n"


def readme_on(devices: str) -> ss.Program:
    return ss.load(README_FILE, devices=devices)


# ---- parsing ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("line", ["devices 2 x cuda[0 1 2 3]", "devices 2 × cuda[0 1 2 3]",
                                  "devices   2    x   cuda[0 1 2 3]", "devices 2×cuda[0 1 2 3]"])
def test_hosts_times_devices_parse_with_x_or_times_and_any_spacing(line: str) -> None:
    [item] = parse(line + "\n", "t.ss").items
    assert isinstance(item, A.Devices)
    assert (item.hosts, item.kind, item.indices) == (2, "cuda", [0, 1, 2, 3])
    assert (item.span.line, item.span.col, item.span.end_col) == (1, 1, len(line) + 1)  # the whole line
    devices = check_source(line + "\n", "t.ss").device_set
    assert (devices.hosts, devices.per_host, devices.count) == (2, 4, 8)
    assert str(devices) == "2 x cuda[0 1 2 3]"
    assert parse_devices(str(devices)) == devices  # the spelling reads back as the same set


def test_one_host_is_the_line_without_hosts() -> None:
    assert parse_devices("1 x cpu[0 1]") == parse_devices("cpu[0 1]") == DeviceSet("cpu", (0, 1))
    assert str(parse_devices("1 × cuda[3]")) == "cuda[3]"


@pytest.mark.parametrize("text, hosts, per_host", [("2 x cpu[0]", 2, 1), ("2 x cpu[0 1]", 2, 2),
                                                   ("2 x cuda[0 1]", 2, 2), ("2 x cpu", 2, 1),
                                                   ("3 × cuda[0 1 2 3]", 3, 4)])
def test_the_valid_forms_count_every_host_s_devices(text: str, hosts: int, per_host: int) -> None:
    devices = parse_devices(text)
    assert (devices.hosts, devices.per_host, devices.count) == (hosts, per_host, hosts * per_host)


def test_ranks_go_host_by_host() -> None:
    devices = parse_devices("2 x cuda[1 3 5]")
    expected = [(host, number) for host in range(2) for number in (1, 3, 5)]
    assert [devices.place(rank) for rank in range(devices.count)] == expected
    assert parse_devices("3 x cpu").place(2) == (2, 0) and parse_devices("cpu[4 7]").place(1) == (0, 7)
    with pytest.raises(IndexError):
        devices.place(6)


# (the line after `devices `, the code, the text the error points at, words of its message)
BAD_HOSTS = [
    ("0 x cpu[0]", "E0105", "0", "positive whole number, not `0`"),
    ("-2 x cpu[0]", "E0105", "-2", "positive whole number, not `-2`"),
    ("2.5 x cpu[0]", "E0105", "2.5", "positive whole number, not `2.5`"),
    ("two x cpu[0]", "E0105", "two", "positive whole number, not `two`"),
    ("2 cpu[0]", "E0105", "cpu", "expected `x` after the number of hosts"),
    ("cpu[0 1] x 2", "E0105", "x", "the number of hosts comes before the devices"),
    ("2x cpu[0]", "E0101", "x", "unexpected character `x` after a number"),
    ("2 x cpu[]", "E0105", "devices 2 x cpu[]", "an empty device list"),
    ("2 x gpu[0]", "E0105", "gpu", "unknown device kind `gpu`"),
]


@pytest.mark.parametrize("text, code, at, words", BAD_HOSTS, ids=[b[0] for b in BAD_HOSTS])
def test_a_bad_number_of_hosts_is_a_coded_error_at_its_place(text: str, code: str, at: str, words: str) -> None:
    source = f"devices {text}\n"
    with pytest.raises(ss.CompileError) as info:
        check_source(source, "t.ss")
    [d] = info.value.diagnostics
    assert d.code == code and words in d.message, d
    col = source.index(at) + 1
    assert (d.span.line, d.span.col, d.span.end_col) == (1, col, col + len(at)), d.span
    assert d.help or "hosts" not in words, "each error about the hosts says what to write instead"
    with pytest.raises(ValueError, match=re.escape(words)):  # ss.load(devices=...) says the same
        parse_devices(text)


def test_the_count_errors_say_how_to_write_hosts() -> None:
    with pytest.raises(ss.CompileError) as info:
        check_source("devices 0 x cuda[0 1]\n", "t.ss")
    assert "devices 2 x cuda[0 1]" in info.value.diagnostics[0].help[0]
    with pytest.raises(ss.CompileError) as info:
        check_source("devices 2x cuda[0 1]\n", "t.ss")
    assert "devices 2 x" in info.value.diagnostics[0].help[0]


def test_x_stays_an_ordinary_name() -> None:
    source = ("devices 2 x cpu[0 1]\n\ndim x = 3\n\ndata Ex:\n    x: [x]\n\n"
              "fn f(x: [n]) -> [n] = x * 2.0\nfn g(e: [b] Ex) -> [b x] = e.x\n")
    prog = ss.load(source)
    assert prog.devices == DeviceSet("cpu", (0, 1), hosts=2)
    one_device = ss.load(source.replace("devices 2 x cpu[0 1]", "devices cpu"))
    assert torch.equal(one_device.f(torch.arange(4.0)), torch.arange(4.0) * 2)
    assert parse("fn x(x: [n]) -> [n] = x\n", "t.ss").items[0].name == "x"


def test_times_outside_a_devices_line_is_refused() -> None:
    with pytest.raises(ss.CompileError) as info:
        check_source("fn f(a: [n]) -> [n] = a × 2.0\n", "t.ss")
    assert info.value.codes == ["E0105"]


# ---- the checker counts hosts × devices -----------------------------------------------------------

@pytest.mark.parametrize("hosts, one_host, count", [("2 x cpu[0 1]", "cpu[0 1 2 3]", 4),
                                                    ("3 x cuda[0 1]", "cuda[0 1 2 3 4 5]", 6),
                                                    ("2 x cpu", "cpu[0 1]", 2), ("1 x cpu[0 1]", "cpu[0 1]", 2)])
def test_the_table_and_the_code_are_those_of_one_host_with_as_many_devices(hosts: str, one_host: str,
                                                                         count: int) -> None:
    several, single = readme_on(hosts), readme_on(one_host)
    table, reference = several.device_table, single.device_table
    assert table.count == reference.count == count
    # Every figure and layout equal (as the JSON shows them): only the devices' name and hosts differ.
    data, expected = to_json(several.checked), to_json(single.checked)
    assert (data.pop("devices"), data.pop("hosts"), data.pop("crosses_hosts")) == (
        str(several.devices), several.devices.hosts, several.devices.hosts > 1)
    assert (expected.pop("devices"), expected.pop("hosts"), expected.pop("crosses_hosts")) == (one_host, 1, False)
    assert data.pop("per_host") * several.devices.hosts == expected.pop("per_host") == count
    for line in data["lines"] + expected["lines"]:  # in words, with the marking: the report's test's
        line.pop("text")
    assert data == expected
    assert (table.shares(64), table.shard_params, table.heads) == (reference.shares(64), reference.shard_params,
                                                                   reference.heads)
    assert several.python_source == single.python_source
    assert several.worker_source == single.worker_source


def test_a_batch_splits_over_every_host_s_devices() -> None:
    table = readme_on("2 x cpu[0 1 2]").device_table
    assert table.shares(64) == [11, 11, 11, 11, 10, 10]  # 64 = 4·11 + 2·10, the first ones taking one more
    assert table.shares(7) == [2, 1, 1, 1, 1, 1]
    assert table.shares() == [11, 11, 11, 11, 10, 10]  # the program's own batches(64)


def test_split_needs_hosts_times_devices_to_divide_the_dim() -> None:
    with pytest.raises(ss.CompileError) as info:
        ss.load("devices 2 x cpu[0 1 2 3]\n    split H\n\n" + HEADS)  # 8 workers don't divide H = 12
    [several] = info.value.diagnostics
    with pytest.raises(ss.CompileError) as info:
        ss.load("devices cpu[0 1 2 3 4 5 6 7]\n    split H\n\n" + HEADS)
    [single] = info.value.diagnostics
    assert several.code == single.code == "E1902"
    assert several.span == single.span and several.help == single.help
    assert several.message == single.message.replace("over 8 devices", "over 8 devices (2 hosts × 4)")
    prog = ss.load("devices 2 x cpu[0 1 2]\n    split H\n\n" + HEADS)  # 6 divide 12, 3 per host or not
    assert prog.device_table.heads_size == 12 and prog.devices.count == 6


# ---- the DeviceTable says which collectives cross hosts -----------------------------------------

def test_the_report_marks_every_collective_and_otherwise_says_what_one_host_says() -> None:
    several, single = readme_on("2 x cpu[0 1]").checked, readme_on("cpu[0 1 2 3]").checked
    text, reference = report(several), report(single)
    assert "crosses hosts" not in reference
    lines = text.splitlines()
    assert lines[1] == "4 devices: 2 hosts × 2 devices each. Every collective runs over all 4 and crosses hosts."
    sends = lines[lines.index("Lines that send"):]
    collectives = [line for line in sends if line.strip().startswith("- ")]
    assert len(collectives) == 4 and all(line.endswith(CROSSES_HOSTS) for line in collectives)
    # Without the marking, the report is the one-host report word for word.
    unmarked = "\n".join(lines[:1] + lines[2:]).replace(CROSSES_HOSTS, "").replace(" on 2 hosts", "")
    assert unmarked == reference.replace("on cpu[0 1 2 3]", "on 2 x cpu[0 1]", 1)


def test_a_hover_on_a_line_that_sends_names_the_hosts() -> None:
    checked = readme_on("2 x cpu[0 1]").checked
    line = next(n for n, text in enumerate(checked.source.splitlines(), 1) if "value_and_grad(" in text)
    hover = line_text(device_table(checked), line)
    assert hover is not None and hover.startswith("Sent between the 4 devices on 2 hosts by this line")
    assert hover.count(CROSSES_HOSTS) == 2


def test_the_json_says_hosts_and_devices_per_host() -> None:
    data = to_json(readme_on("2 x cuda[0 1 2 3]").checked)
    assert (data["devices"], data["count"], data["hosts"], data["per_host"], data["crosses_hosts"]) == \
        ("2 x cuda[0 1 2 3]", 8, 2, 4, True)
    one = json.loads(json.dumps(to_json(readme_on("cuda[0 1 2 3]").checked)))
    assert (one["hosts"], one["per_host"], one["crosses_hosts"]) == (1, 4, False)


def test_the_notebook_table_heads_with_hosts_and_notes_the_crossing() -> None:
    view = DeviceTableView.of(readme_on("2 x cpu[0 1]"))
    assert view.title() == ("Placement and communication on 2 x cpu[0 1] (4 devices: 2 hosts × 2) — "
                            "a batch of 64 splits 16/16/16/16")
    html = view.table_html()
    assert html.count("crosses hosts") == 5  # the note, and each of the 4 collectives
    single = DeviceTableView.of(readme_on("cpu[0 1 2 3]"))
    assert single.title() == "Placement and communication on cpu[0 1 2 3] — a batch of 64 splits 16/16/16/16"
    assert "hosts" not in single.table_html()


# ---- running needs a cluster --------------------------------------------------------------------

@pytest.mark.parametrize("devices", ["2 x cpu[0 1]", "2 x cuda[0 1]"])
def test_workers_on_several_hosts_without_a_cluster_are_a_clear_error(devices: str) -> None:
    prog = readme_on(devices)
    assert prog.python_source and prog.worker_source and prog.device_table.hosts == 2  # all without one
    with pytest.raises(ClusterNeededError) as info:
        prog.Mlp.init(seed=0)  # where the workers would start; cuda's visibility is the cluster's to check
    assert isinstance(info.value, ss.WorkerError)
    message = str(info.value)
    for how in (f"`devices {devices}` names 2 hosts", 'ss.cluster("ray://head:10001")', 'ss.cluster("auto")',
                "%shapescript cluster", "pip install 'shapescript[ray]'", f"`devices {devices[4:]}`"):
        assert how in message, how
    assert prog.pool is None and prog.last_pool is None  # nothing started


def test_a_notebook_on_several_hosts_says_why_no_workers_start() -> None:
    session = Session({})
    notes = session.run_cell(Cell("cell [1]", "%%shapescript\ndevices 2 x cpu[0 1]\n", first_line=2))
    [note] = [n for n in notes if "couldn't be started" in n]
    assert 'ss.cluster("ray://head:10001")' in note and "%shapescript cluster" in note
    assert session.program is not None and session.program.pool is None
    assert str(session.program.devices) == "2 x cpu[0 1]"
    session.set_devices("3 × cpu[0]")  # `%shapescript devices 3 × cpu[0]`
    assert session.program.devices == DeviceSet("cpu", (0,), hosts=3) and session.program.pool is None
    session.set_devices("1 x cpu[0]")
    assert session.program.devices == DeviceSet("cpu", (0,)) and not session.program.several
