"""Extern fns on several devices: given the batch axis they are E1801, and one that names the
controller's own script is an ImportError on the workers, whose top level never runs there."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import shapescript as ss

LAYER_NORM_OVER_BATCH = textwrap.dedent("""\
    devices cpu[0 1]

    dim D = 4

    data Ex:
        x: [D]

    extern fn std_layer_norm(x: [n D], over: Axis[n]) -> [n D] = "shapescript.std.layer_norm"

    fn normed(batch: [b] Ex) -> [b D]:
        return std_layer_norm(batch.x, over=b)
    """)


def test_an_extern_fn_given_the_batch_axis_is_E1801_on_several_devices() -> None:
    with pytest.raises(ss.CompileError) as caught:
        ss.load(LAYER_NORM_OVER_BATCH, name="ln.ss")
    [d] = caught.value.diagnostics
    assert d.code == "E1801"
    assert (d.span.line, d.span.col) == (11, 41)  # the `b` of over=b
    assert "std_layer_norm" in d.message
    one = ss.load(LAYER_NORM_OVER_BATCH, devices="cpu", name="ln.ss")  # one device: the whole batch
    assert one.checked.placement("normed").where != "controller"
    # along another axis it is per example, and fine
    ss.load(LAYER_NORM_OVER_BATCH.replace("Axis[n]", "Axis[D]").replace("over=b", "over=D"), name="ln.ss")


SCRIPT = textwrap.dedent("""\
    import sys
    import torch
    import shapescript as ss

    with open(sys.argv[2], "a") as f:  # the top level's runs, one line each
        f.write(f"{__name__}\\n")

    def double(x):
        return x * 2

    SRC = '''devices {devices}
    dim D = 3
    extern fn double(x: [b D]) -> [b D] = "{module}.double"
    fn f(x: [b D]) -> [b D] = double(x)
    '''

    prog = ss.load(SRC, name="prog.ss")
    try:
        print(prog.f(torch.ones(4, 3)).sum().item())
    except ImportError as e:
        print("ImportError:", e)
    finally:
        prog.stop()
    """)


@pytest.mark.parametrize("devices", ["cpu", "cpu[0 1]"])
@pytest.mark.parametrize("module", ["train", "__main__"])
def test_an_extern_fn_in_the_main_script_never_imports_it_again(tmp_path: Path, devices: str, module: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("{devices}", devices).replace("{module}", module))
    runs = tmp_path / "runs.txt"
    env = dict(os.environ, TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, str(script), "-", str(runs)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert runs.read_text().splitlines() == ["__main__"]  # the top level ran once, as the main script
    out = done.stdout.strip()
    if devices == "cpu":  # in the controller the script is `__main__`, already running
        assert out == "24.0"
    else:
        assert out.startswith("ImportError:") and "the script the controller runs" in out, out
        assert str(script) in out or "__main__" in out
