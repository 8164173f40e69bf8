"""Every size a program can write gets an answer in bounded time: a diagnostic
where the size can't run, the figures in words where it can. Each case runs under a CPU-time alarm
(`cpu_bound`), so a hang fails the test in seconds instead of stalling the suite; the property test
puts 500 programs with sizes up to 10^30 through check, comms, build and a hover of the language
server, called in this process."""

from __future__ import annotations

import itertools
import re
import signal
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from lsprotocol import types as L
from programs import README

import shapescript as ss
from shapescript.api import compile_program
from shapescript.cli import main as cli_main
from shapescript.devices import MAX_CUDA_INDEX, MAX_DEVICES, DeviceSet, shares
from shapescript.errors import CompileError
from shapescript.lower.targets import Target
from shapescript.lsp import ShapeScriptServer, create_server
from shapescript.pipeline import python_module, python_modules
from shapescript.plan.comms_text import report, to_json

LIMIT_S = 2.0  # CPU seconds for one program's check, comms, build and hover


@contextmanager
def cpu_bound(seconds: float = LIMIT_S) -> Iterator[None]:
    """Fail (TimeoutError) once this process has spent `seconds` of CPU inside the block, and fail
    if it spent more in all. CPU time, not wall time: a loaded machine slows it without failing it."""
    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"still running after {seconds} s of CPU time")
    before = signal.signal(signal.SIGPROF, expire)
    start = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, before)
    spent = time.process_time() - start
    assert spent < seconds, f"took {spent:.2f} s of CPU"


def compile_error(source: str, **kwargs: object) -> CompileError:
    with cpu_bound(), pytest.raises(CompileError) as info:
        compile_program(source, "big.ss", **kwargs)  # type: ignore[arg-type]
    return info.value


HEADS = "dim Dh = 4\n\nfn f(x: [n H Dh]) -> [n H Dh] = x * 2.0\n"
MLP = README.replace("devices cuda[0 1 2]\n", "")  # a devices line of each test's own


def split_program(devices: str, size: int) -> str:
    return f"devices {devices}\n    split H\n\ndim H = {size}\n{HEADS}"


# -- `split H` over devices that don't divide H -------------------------------------------------------

def test_a_split_of_a_dim_of_two_to_the_31_says_which_counts_divide_it_at_once() -> None:
    (d,) = compile_error(split_program("cpu[0 1 2]", 2**31)).diagnostics
    assert d.code == "E1902" and d.span.line == 2
    assert d.help == ("each device holds an equal part of H: use 2, 4, 8 or 16 devices",)


@pytest.mark.parametrize("size", [1_000_000_007, 10**30 + 57])  # primes (sympy.isprime)
def test_a_split_no_count_of_devices_divides_says_so(size: int) -> None:
    assert all(size % n for n in (2, 3, 5, 7, 11, 13))
    (d,) = compile_error(split_program("cpu[0 1 2]", size)).diagnostics
    assert d.code == "E1902"
    assert d.help == (f"no number of devices from 2 to {MAX_DEVICES:,} divides H = {size}: remove `split H`, "
                      "or give H a size with a small factor",)


def test_the_counts_suggested_are_the_smallest_that_divide() -> None:
    size = 2 * 3 * 1_048_583  # the first prime above 2^20: 2, 3 and 6 are all the counts that can run
    (d,) = compile_error(split_program("cpu[0 1 2 3]", size)).diagnostics
    assert d.help == ("each device holds an equal part of H: use 2, 3 or 6 devices",)
    assert all(size % n == 0 for n in (2, 3, 6)) and all(size % n for n in (4, 5))


# -- more devices than can run ------------------------------------------------------------------------

@pytest.mark.parametrize("devices, reason", [
    ("99999999999999999999 x cpu[0 1]", "199,999,999,999,999,999,998 devices, but a program runs on at most 1,048,576"),
    ("524289 x cpu[0 1]", "1,048,578 devices, but a program runs on at most 1,048,576"),
    ("cuda[99999999999999999999]", f"CUDA device 99999999999999999999: torch numbers a machine's CUDA devices "
                                   f"from 0 to {MAX_CUDA_INDEX}"),
    ("cuda[0 128]", "CUDA device 128: torch numbers a machine's CUDA devices from 0 to 127"),
])
def test_devices_no_machine_has_are_an_error_at_the_devices_line(devices: str, reason: str) -> None:
    (d,) = compile_error(f"devices {devices}\n" + MLP).diagnostics
    assert (d.code, d.span.line, d.span.col) == ("E1806", 1, 1)
    assert d.message == f"more devices than can run: {reason}"


def test_the_bound_is_the_devices_in_all_and_a_split_over_them_says_nothing_more() -> None:
    assert compile_program("devices 524288 x cpu[0 1]\n" + MLP, "big.ss").device_set.count == MAX_DEVICES
    assert compile_program("devices cuda[127]\n" + MLP, "big.ss").device_set.indices == (MAX_CUDA_INDEX,)
    assert compile_error(split_program("99999999999999999999 x cpu[0 1]", 7)).codes == ["E1806"]


def test_devices_given_when_loading_are_bounded_the_same_way() -> None:
    assert compile_error(MLP, devices=DeviceSet("cpu", (0, 1), hosts=10**20)).codes == ["E1806"]
    for devices in ("99999999999999999999 x cpu[0 1]", "cuda[200]"):
        with cpu_bound(), pytest.raises(ValueError, match="more devices than can run"):
            ss.load(MLP, devices=devices)


def test_a_cuda_device_torch_cant_name_is_a_compile_error_not_a_torch_traceback() -> None:
    """It used to load, then fail at torch.device("cuda:99999999999999999999") with torch's
    RuntimeError; cuda[128] loaded as torch's cuda:-128."""
    for devices in ("cuda[99999999999999999999]", "cuda[128]"):
        with cpu_bound(), pytest.raises(CompileError) as info:
            ss.load(f"devices {devices}\n" + MLP, name="big.ss")
        (d,) = info.value.diagnostics
        assert (d.code, d.span.file, d.span.line) == ("E1806", "big.ss", 1)


def test_the_shares_on_many_devices_are_two_groups_in_words() -> None:
    checked = compile_program("devices 1000 x cpu[0 1 2]\n" + MLP, "big.ss")
    with cpu_bound():
        text = report(checked)
        data = to_json(checked, 10**30)
    assert text.splitlines()[0] == "big.ss on 1000 x cpu[0 1 2]: a batch of 64 splits 1 on each of 64 devices, " \
                                   "0 on each of 2,936"
    assert data["shares"] == shares(10**30, 3000) and sum(data["shares"]) == 10**30
    few = report(compile_program("devices 2 x cpu[0 1 2]\n" + MLP, "big.ss"))
    assert few.splitlines()[0].endswith("a batch of 64 splits 11/11/11/11/10/10")


# -- whole numbers of many digits -----------------------------------------------------------------------

@pytest.mark.parametrize("line", ["dim D = {N}", "devices cpu[{N}]", "fn g(x: [n]) -> [n] = x * {N}"])
def test_a_number_of_thousands_of_digits_is_a_syntax_error_at_it(line: str) -> None:
    """Python refuses to read an int of more than 4,300 digits: it was an internal ValueError."""
    source = line.replace("{N}", "7" * 5000) + "\n"
    (d,) = compile_error(source).diagnostics
    assert (d.code, d.span.line, d.span.col) == ("E0105", 1, source.index("7") + 1)
    assert d.message == "a whole number of 5,000 digits"
    assert compile_program(line.replace("{N}", "7" * 100) + "\n", "big.ss")  # 100 digits are fine


def test_a_chain_of_squares_is_refused_before_it_is_computed() -> None:
    """Each line doubles the size's digits: 40 of them would be a trillion digits."""
    chain = "dim D0 = 10000000000\n" + "".join(f"dim D{k + 1} = D{k} * D{k}\n" for k in range(40))
    (d,) = compile_error(chain).diagnostics
    assert (d.code, d.span.line) == ("E0310", 5)  # D4 = 10^160
    assert d.message == "dim `D4` = D3 * D3 is a size of 161 digits"
    (d,) = compile_error(chain.replace("10000000000", "9" * 100)).diagnostics
    assert (d.code, d.span.line) == ("E0310", 2)
    assert compile_program(chain.replace("10000000000", "2").split("dim D5")[0], "big.ss").dim_values["D4"] == 2**16


def test_a_chain_of_squares_of_a_dim_given_when_loading_stays_symbolic_until_it_is_given() -> None:
    chain = "dim D0\n" + "".join(f"dim D{k + 1} = D{k} * D{k}\n" for k in range(40))
    with cpu_bound():
        assert compile_program(chain, "big.ss").dim_values["D40"] is None
    assert compile_error(chain, dims={"D0": 3}).codes == ["E0310"]


def test_a_size_given_when_loading_has_at_most_a_hundred_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (d,) = compile_error("dim H\n" + HEADS, dims={"H": 10**5000}).diagnostics
    assert (d.code, d.message) == ("E0310", "dim `H` is given a size of 5,001 digits")
    path = tmp_path / "heads.ss"
    path.write_text("dim H\n" + HEADS)
    with cpu_bound():
        assert cli_main(["check", str(path), "--dim", "H=" + "7" * 5000]) == 1
    assert capsys.readouterr().err == "error: --dim H: a size has at most 100 digits, not 5,000\n"


# -- the property test --------------------------------------------------------------------------------

BIG = st.integers(1, 10**30)
SIZE = st.one_of(st.integers(1, 64), BIG, st.sampled_from([2**31, 2**31 - 1, 2**63, 10**30]))


@st.composite
def programs(draw: st.DrawFn) -> tuple[str, int]:
    """A program with big sizes everywhere a program writes one: its dims, its hosts, its device
    numbers, its split, its batch size. Returns it and the hosts × devices it names."""
    kind = draw(st.sampled_from(["cpu", "cuda"]))
    indices = draw(st.lists(st.one_of(st.integers(0, 8), st.integers(0, 200), BIG), min_size=1, max_size=4, unique=True))
    hosts = draw(st.one_of(st.just(1), st.integers(1, 8), BIG))
    listed = draw(st.booleans())
    one_host = f"{kind}[{' '.join(map(str, indices))}]" if listed else kind
    devices = f"{hosts} x {one_host}" if hosts > 1 else one_host
    count = hosts * (len(indices) if listed else 1)
    split = draw(st.booleans())
    h, dh, d, hd, c, batch = (draw(SIZE) for _ in range(6))
    source = textwrap.dedent(f"""\
        devices {devices}
        {"    split H" if split else ""}
        dim H = {h}
        dim Dh = {dh}
        dim D = {d}
        dim Hd = {hd}
        dim C = {c}
        dim E = H * Dh

        data Digit:
            img: [D]
            label: [] Index[C]

        model Mlp:
            param w1: [D Hd] = normal(std=0.02)
            param w2: [Hd C] = normal(std=0.02)

        fn heads(x: [n H Dh]) -> [n H Dh] = x * 2.0

        fn forward(m: Mlp, x: [b D]) -> [b C]:
            return relu(x @ m.w1) @ m.w2

        fn loss(m: Mlp, batch: [b] Digit) -> []:
            return cross_entropy(forward(m, batch.img), batch.label, over=C)

        fn train_step(mut m: Mlp, mut opt: AdamW[Mlp], batch: [b] Digit) -> []:
            l, g = value_and_grad(loss, m, batch)
            update(mut m, mut opt, g)
            return l

        fn run(mut m: Mlp, mut opt: AdamW[Mlp], data: Dataset[Digit], log: Sink):
            for batch in data |> batches({batch}):
                l = train_step(mut m, mut opt, batch)
                write(log, logs(loss=l))
        """)
    return source, count


@pytest.fixture(scope="module")
def server() -> ShapeScriptServer:
    """The language server, initialized as a client would, driven in this process."""
    server = create_server()
    for _ in server.protocol.lsp_initialize(L.InitializeParams(capabilities=L.ClientCapabilities())):
        pass
    return server


URIS = (f"file:///big/{k}.ss" for k in itertools.count())  # a document each: no clean check kept from another


def hover(server: ShapeScriptServer, source: str, line: int, column: int) -> str | None:
    """What the server's hover handler answers at (line, column), 1-based, in a new document `source`."""
    uri = next(URIS)
    server.workspace.put_text_document(L.TextDocumentItem(uri=uri, language_id="shapescript", version=1,
                                                          text=source))
    server.diagnose(server.workspace.get_text_document(uri))
    answer = server.hover(L.HoverParams(text_document=L.TextDocumentIdentifier(uri=uri),
                                        position=L.Position(line=line - 1, character=column - 1)))
    server.workspace.remove_text_document(uri)
    server.good.pop(uri, None)
    if answer is None:
        return None
    assert isinstance(answer.contents, L.MarkupContent)
    return answer.contents.value


@settings(max_examples=500, deadline=None, phases=[Phase.generate], derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(case=programs(), batch=st.one_of(st.none(), BIG))
def test_every_size_gets_an_answer_in_bounded_time(server: ShapeScriptServer, case: tuple[str, int], batch: int | None) -> None:
    source, count = case
    lines = source.splitlines()
    with cpu_bound():
        try:
            checked = compile_program(source, "big.ss")
        except CompileError as e:
            checked, codes = None, set(e.codes)
            assert codes <= {"E1806", "E1902"}, str(e)  # nothing else is wrong with the program
            assert ("E1806" in codes) == (count > MAX_DEVICES or (" cuda[" in lines[0] and any(
                int(n) > MAX_CUDA_INDEX for n in re.findall(r"\d+", lines[0].split("[")[1])))), str(e)
            for help in (h for d in e.diagnostics if d.code == "E1902" for h in d.help):
                size = int(lines[2].split("=")[1])
                suggested = [int(n.replace(",", "")) for n in re.findall(r"[\d,]*\d", help.split(":")[-1])]
                assert all(size % n == 0 and n <= MAX_DEVICES for n in suggested), help
        if checked is not None:
            several = checked.device_set.count > 1
            assert checked.device_set.count == count
            text = report(checked, batch)
            data = to_json(checked, batch)
            n = batch if batch is not None else int(lines[-3].split("batches(")[1].split(")")[0])
            if several and not checked.device_set.split:
                assert sum(data["shares"]) == n and max(data["shares"]) == -(-n // count)
                assert f"a batch of {n} splits " in text.splitlines()[0]
            if several:
                assert all(module for module in python_modules(checked, (Target.CONTROLLER, Target.WORKER)))
            else:
                assert python_module(checked)
        answer = hover(server, source, 20, lines[19].index("x: [b D]") + 1)  # forward's `x`
        assert (answer is not None) == (checked is not None), answer
        if answer is not None:
            assert answer.startswith("`x`: [b D]")
