"""The language server, `shapescript lsp`, driven over stdio the way an editor drives it.

A small JSON-RPC client with Content-Length framing talks to a real server process. Every wait has
a deadline, so a server that hangs or dies fails the test instead of stalling the suite.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from support import ROOT

TIMEOUT = 20.0  # seconds for any one answer; the server starts in a few (it imports torch)
MLP = ROOT / "examples" / "readme" / "mlp.ss"
GOOD = MLP.read_text()
MISTAKE = "relu(x @ m.w1) @ m.w1"  # the README's mistake: w1 where w2 belongs
BAD = GOOD.replace("relu(x @ m.w1) @ m.w2", MISTAKE)
assert BAD != GOOD


class Client:
    """An LSP client: requests wait for their response; notifications are kept until asked for."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.log = log  # the server's stderr, shown when a wait fails
        self.stdin: IO[bytes] = proc.stdin
        self.incoming: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.kept: list[dict[str, Any]] = []
        self.next_id = 0
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, out: IO[bytes]) -> None:
        # One framed message at a time, until the server closes its stdout (then None).
        while True:
            headers: dict[str, str] = {}
            while (line := out.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("ascii").partition(":")
                headers[name.strip().lower()] = value.strip()
            if not line:
                self.incoming.put(None)
                return
            self.incoming.put(json.loads(out.read(int(headers["content-length"]))))

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.stdin.flush()

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        self.send({"method": method, "params": params})

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self.next_id += 1
        ident = self.next_id
        self.send({"id": ident, "method": method, "params": params})
        reply = self._next(lambda m: m.get("id") == ident and "method" not in m, f"the answer to {method}")
        assert "error" not in reply, f"{method} failed: {reply['error']}"
        return reply["result"]

    def notification(self, method: str, test: Callable[[dict[str, Any]], bool] = lambda p: True) -> Any:
        """The params of the first notification `method`, not yet taken, whose params pass `test`."""
        return self._next(lambda m: m.get("method") == method and test(m["params"]), method)["params"]

    def _next(self, wanted: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        for i, message in enumerate(self.kept):
            if wanted(message):
                return self.kept.pop(i)
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                message = self.incoming.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                raise AssertionError(f"no {what} within {TIMEOUT:.0f} s; kept: {self.kept}\n"
                                     f"server log:\n{self.log.read_text()}") from None
            if message is None:
                raise AssertionError(f"the server closed its output before {what} (exit {self.proc.poll()})\n"
                                     f"server log:\n{self.log.read_text()}")
            if wanted(message):
                return message
            self.kept.append(message)

    # ---- the document calls the tests make ----------------------------------------------------

    def open(self, uri: str, text: str) -> None:
        self.notify("textDocument/didOpen",
                    {"textDocument": {"uri": uri, "languageId": "shapescript", "version": 1, "text": text}})

    def change(self, uri: str, version: int, text: str) -> None:
        self.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                               "contentChanges": [{"text": text}]})

    def diagnostics(self, uri: str, version: int) -> list[dict[str, Any]]:
        return self.notification("textDocument/publishDiagnostics",
                                 lambda p: p["uri"] == uri and p.get("version") == version)["diagnostics"]

    def hover(self, uri: str, line: int, character: int) -> Any:
        return self.request("textDocument/hover", {"textDocument": {"uri": uri},
                                                   "position": {"line": line, "character": character}})


@contextmanager
def server(tmp_path: Path, python: Sequence[str] = ("-m", "shapescript.cli", "lsp")) -> Iterator[Client]:
    """A server process, initialized; it must shut down and exit with 0 when the test is done."""
    log_path = tmp_path / "server.log"
    log = log_path.open("wb")  # a file, so a chatty server can't fill a pipe and stall
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, *python], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=log, cwd=tmp_path, env=env)
    try:
        client = Client(proc, log_path)
        result = client.request("initialize", {
            "processId": os.getpid(), "rootUri": tmp_path.as_uri(),
            "capabilities": {"textDocument": {"hover": {"contentFormat": ["markdown", "plaintext"]},
                                              "publishDiagnostics": {"versionSupport": True}},
                             "general": {"positionEncodings": ["utf-16"]}}})
        assert result["serverInfo"]["name"] == "shapescript"
        caps = result["capabilities"]
        assert caps["hoverProvider"] and caps["textDocumentSync"]["change"] == 1  # full sync
        client.notify("initialized", {})
        yield client
        assert client.request("shutdown") is None
        client.notify("exit")
        assert proc.wait(timeout=10) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def expected_range(text: str, needle: str) -> dict[str, dict[str, int]]:
    """The 0-based range of `needle`'s one occurrence in `text`, counted in UTF-16 units as LSP counts."""
    assert text.count(needle) == 1
    before = text[:text.index(needle)]
    line = before.count("\n")
    start = utf16_len(before[before.rfind("\n") + 1:])
    return {"start": {"line": line, "character": start},
            "end": {"line": line, "character": start + utf16_len(needle)}}


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def axis_range(start: dict[str, int], text: str, name: str) -> dict[str, dict[str, int]]:
    """The range of the dim `name` inside `text` (an ASCII declaration) written at `start`."""
    column = start["character"] + text.index(f"{name}]" if f"{name}]" in text else f"{name} ")
    return {"start": {"line": start["line"], "character": column},
            "end": {"line": start["line"], "character": column + len(name)}}


def fn_name_position(text: str, name: str) -> tuple[int, int]:
    """Where `name` is written in its `fn name(` line."""
    at = expected_range(text, f"fn {name}(")["start"]
    return at["line"], at["character"] + len("fn ")


def test_diagnostics_and_hovers_follow_the_edits(tmp_path: Path) -> None:
    uri = (tmp_path / "mlp.ss").as_uri()
    with server(tmp_path) as client:
        client.open(uri, BAD)
        [diag] = client.diagnostics(uri, 1)
        assert diag["code"] == "E0304" and diag["source"] == "shapescript" and diag["severity"] == 1
        assert diag["range"] == expected_range(BAD, MISTAKE)
        assert diag["message"].splitlines()[0].startswith("`@` contracts [b Hd]'s last axis Hd")
        assert "Hd vs D" in diag["message"] and "help: `@` multiplies the last axis" in diag["message"]
        assert diag["codeDescription"]["href"].endswith("errors.md#e0304-matrix-product-of-mismatched-axes")
        # The secondary labels, where each operand's axis was declared, as related information.
        w1 = expected_range(BAD, "param w1: [D Hd]")["start"]
        related = {(r["location"]["uri"], json.dumps(r["location"]["range"], sort_keys=True)): r["message"]
                   for r in diag["relatedInformation"]}
        assert related == {(uri, json.dumps(axis_range(w1, "param w1: [D Hd]", "Hd"), sort_keys=True)):
                           "`m.w1`'s last axis is Hd here",
                           (uri, json.dumps(axis_range(w1, "param w1: [D Hd]", "D"), sort_keys=True)):
                           "`m.w1`'s first axis is D here"}
        forward = fn_name_position(BAD, "forward")
        assert client.hover(uri, *forward) is None  # nothing has checked cleanly yet

        client.change(uri, 2, GOOD)
        assert client.diagnostics(uri, 2) == []
        hover = client.hover(uri, *forward)
        assert hover["contents"]["kind"] == "markdown"
        assert hover["contents"]["value"].startswith("`fn forward` runs on the workers")
        # The value_and_grad line, hovered anywhere: the manual's figures for cuda[0 1 2].
        at = expected_range(GOOD, "value_and_grad(loss, m, batch)")["start"]
        sent = client.hover(uri, at["line"], 4)["contents"]["value"]
        assert "203,264 × f32 = 813,056 bytes (794 KiB)" in sent
        assert "inside `loss` (forward and backward): 16 bytes per call" in sent
        assert "In all: 813,072 bytes (794 KiB)." in sent

        # Broken again in another line, the lines unmoved: the last clean check still answers.
        client.change(uri, 3, BAD)
        assert [d["code"] for d in client.diagnostics(uri, 3)] == ["E0304"]
        assert client.hover(uri, *forward) == hover

        # A line added above: the old check's lines no longer match, so no hover rather than a wrong one.
        shifted = "# a new first line\n" + BAD
        client.change(uri, 4, shifted)
        [diag] = client.diagnostics(uri, 4)
        assert diag["range"] == expected_range(shifted, MISTAKE)
        assert client.hover(uri, forward[0] + 1, forward[1]) is None

        client.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
        assert client.diagnostics(uri, 4) == [diag]


def test_syntax_errors_in_utf16_columns_and_closing(tmp_path: Path) -> None:
    uri = (tmp_path / "bad.ss").as_uri()
    # The checker counts the emoji as one column; LSP's default UTF-16 counts it as two.
    text = 'dim D = 4\n\npython fn load() -> [D] = "m.\N{FACE SAVOURING DELICIOUS FOOD}" $\n'
    with server(tmp_path) as client:
        client.open(uri, text)
        [diag] = client.diagnostics(uri, 1)
        assert diag["code"] == "E0101"
        assert diag["range"] == expected_range(text, "$")
        client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        closed = client.notification("textDocument/publishDiagnostics", lambda p: p["uri"] == uri)
        assert closed["diagnostics"] == []


def test_a_crash_in_the_checker_is_logged_and_the_server_goes_on(tmp_path: Path) -> None:
    sabotaged = ["-c", "import shapescript.lsp as L\n"
                       "def boom(*args): raise RuntimeError('checker bug')\n"
                       "L.check_source = boom\n"
                       "L.serve()\n"]
    uri = (tmp_path / "mlp.ss").as_uri()
    with server(tmp_path, sabotaged) as client:
        client.open(uri, GOOD)
        logged = client.notification("window/logMessage", lambda p: p["type"] == 1)
        assert "internal error in checking" in logged["message"] and "checker bug" in logged["message"]
        assert client.hover(uri, *fn_name_position(GOOD, "forward")) is None  # still answering
        assert not [m for m in client.kept if m.get("method") == "textDocument/publishDiagnostics"]


def test_without_pygls_it_says_what_to_install() -> None:
    block = textwrap.dedent("""\
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "pygls":
                    raise ImportError("no pygls here")
        sys.meta_path.insert(0, Block())
        from shapescript.cli import main
        sys.exit(main(["lsp"]))
        """)
    out = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and out.stdout == ""
    assert "pip install 'shapescript[editor]'" in out.stderr and "Traceback" not in out.stderr


def _message(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return b"Content-Length: %d\r\n\r\n" % len(data) + data


def test_the_server_exits_when_its_input_ends(tmp_path: Path) -> None:
    """An editor that goes away without `exit` closes the server's stdin: the server ends with 0,
    at once; so does one started with no input at all (stdin at end of file, or closed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "shapescript", "lsp"]
    said = _message({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                     "params": {"processId": None, "rootUri": None, "capabilities": {}}})
    said += _message({"jsonrpc": "2.0", "method": "initialized", "params": {}})
    said += _message({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
        "uri": (tmp_path / "mlp.ss").as_uri(), "languageId": "shapescript", "version": 1, "text": BAD}}})
    runs = {
        "talked, then closed": dict(input=said),
        "nothing, then closed": dict(input=b""),
        "stdin at end of file": dict(stdin=subprocess.DEVNULL),
        "stdin closed": dict(stdin=subprocess.DEVNULL, preexec_fn=lambda: os.close(0)),
    }
    for what, how in runs.items():
        start = time.monotonic()
        out = subprocess.run(command, capture_output=True, timeout=TIMEOUT, cwd=tmp_path, env=env, **how)  # type: ignore[call-overload]
        assert out.returncode == 0, (what, out.stderr.decode())
        assert b"Traceback" not in out.stderr, what
        assert time.monotonic() - start < TIMEOUT, what
        if what == "talked, then closed":  # it answered before the input ended
            assert b'"serverInfo"' in out.stdout and b"publishDiagnostics" in out.stdout
