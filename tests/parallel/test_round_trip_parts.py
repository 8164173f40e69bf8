"""benchmarks/round_trip_parts.py reaches into the pool (its workers' sockets, a call's message) to
take a round trip apart: run it quickly, so that a change there breaks this test, not the script."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "round_trip_parts.py"


@pytest.mark.slow
def test_the_round_trip_parts_run_and_each_is_timed(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("round_trip_parts", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--quick"])  # each side asserts its answer: the workers' replies are the call's result
    out = capsys.readouterr().out
    timed = re.findall(r"^  (.+?)\s+(\d+) µs$", out, re.M)
    assert [name for name, _ in timed] == ["prog.ident, every worker", "its message to every worker",
                                           "its message to worker 0 alone", "ping, every worker"], out
    assert all(int(us) > 0 for _, us in timed)
