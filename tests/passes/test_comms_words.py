"""The DeviceTable's words say exactly what each device holds (issue 44): under `split H` alone only
the params with an H axis are split, so only their gradients and optimizer state are, the others
whole on every device; under `shard params` every one is in pieces; with both, the params with H
split along it and the others in pieces. And a size reads the same from Python as in
`shapescript comms`."""

from __future__ import annotations

import sympy
from support import cli

from shapescript.api import compile_program
from shapescript.plan.comms import device_table
from shapescript.plan.comms_text import layout_text, report

# The program: `w_o` has the H axis (a block of whole heads), `v` none.
PROGRAM = """devices cpu[0 1]
{options}
dim D = 8
dim H = 2
dim Dh = 4

model M:
    param w_o: [(H Dh) D] = normal(std=0.02)
    param v: [D] = normal(std=0.02)

fn loss(m: M, x: [n (H Dh)]) -> []:
    return sum((x @ m.w_o) * m.v)

fn step(mut m: M, mut opt: AdamW[M], x: [n (H Dh)]) -> []:
    l, g = value_and_grad(loss, m, x)
    update(mut m, mut opt, g)
    return l
"""
W_O, V = 8 * 8 * 4, 8 * 4  # each param's bytes, whole


def program(*options: str) -> str:
    return PROGRAM.format(options="".join(f"    {o}\n" for o in options))


def rows(*options: str) -> dict[str, str]:
    """`shapescript comms`'s line of each of step's values, by name."""
    text = report(compile_program(program(*options), "h.ss"))
    return {name: next(line for line in text.splitlines() if f"in `step`: `{name}`:" in line)
            for name in ("m", "opt", "g")}


def test_split_h_alone_splits_only_the_gradients_and_state_of_params_with_h() -> None:
    got = rows("split H")
    assert "`g`: Grad[M], split along H: the gradients of the params with H (`w_o`), each device holding its " \
           "part of them; the others whole on every device: 160 bytes on each device" in got["g"]
    assert "the state of the params with H (`w_o`) split along H as they are, the others' state whole: " \
           "320 bytes of state each" in got["opt"]
    assert "its params with H split along it (`w_o`), the others whole on every device: 160 bytes" in got["m"]
    for text in got.values():  # nothing claims every gradient or every param is in pieces
        assert "piece" not in text and "every gradient" not in text, text
    # the figures: w_o's half and v whole on each device; AdamW's two moments of each
    table = device_table(compile_program(program("split H"), "h.ss"))
    assert int(table.models["M"].bytes) == W_O // 2 + V == 160
    g = next(v for v in table.values if v.name == "g")
    assert g.split_params == ("w_o",) and int(g.bytes) == 160
    assert layout_text(table, g) == "gradients of params with H split along it, the others whole"


def test_shard_params_puts_every_gradient_in_pieces() -> None:
    got = rows("shard params")
    assert "`g`: Grad[M], sharded: each device holds its piece of every gradient, 144 bytes" in got["g"]
    assert "beside its pieces of the model's params: 288 bytes of state each (two moments per value of its pieces)" \
        in got["opt"]
    assert "split along" not in got["g"] + got["opt"]


def test_both_options_name_the_params_split_along_h_and_the_others_in_pieces() -> None:
    got = rows("split H", "shard params")
    both = " (`w_o` split along H, the others in pieces)"
    assert f"each device holds its piece of every gradient{both}, 144 bytes" in got["g"]
    assert f"beside its pieces of the model's params{both}: 288 bytes of state" in got["opt"]
    assert f"each device holds half of every param of M{both}, 144 bytes of its params" in got["m"]


def test_a_size_reads_the_same_from_python_as_in_shapescript_comms(tmp_path) -> None:
    """A generic dim prints as written (`2048*b`, not sympy's `_b`), and each record's `bytes_text`
    is the CLI's own words."""
    import shapescript as ss
    source = ("devices cpu[0 1]\n\ndim D = 512\n\ndata Ex:\n    x: [D]\n\n"
              "fn total(batch: [b] Ex) -> [D] = sum(batch.x, over=b)\n\nfn twice(x: [b D]) -> [b D] = x * 2.0\n")
    prog = ss.load(source, name="s.ss")
    table = prog.device_table
    x = next(v for v in table.values if v.fn == "twice" and v.name == "x")  # whole: b is no batch here
    assert str(x.bytes) == repr(x.bytes) == "2048*b" and "_b" not in repr(x)
    assert x.bytes_text == "2,048·b bytes" and x.per_example_text is None
    batch = next(v for v in table.values if v.name == "batch")
    assert str(batch.bytes) == "2048*b" and batch.per_example_text == "2,048 bytes (2.00 KiB)"
    [b] = x.bytes.free_symbols  # still a dim of its own, to put a size in
    assert x.bytes.subs(b, 3) == 6144 and isinstance(x.bytes, sympy.Expr)
    plan = table.fns["total"]
    assert plan.bytes_text == "2,048 bytes (2.00 KiB)" and plan.sent[0].bytes_text == plan.bytes_text
    (path := tmp_path / "s.ss").write_text(source)
    out = cli("comms", str(path)).stdout
    assert f"`x`: [b D], whole on every device: {x.bytes_text}" in out
    assert f"Each call sends {plan.bytes_text} between" in out
