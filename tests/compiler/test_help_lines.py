"""The checker's words after a slip (issue 44, item 5): one error for one mistake, a help line that
never suggests a conversion that loses values, constructs the language lacks named as such."""

from __future__ import annotations

import pytest

import shapescript as ss
from shapescript.errors import CompileError


def diagnostics(src: str) -> list[tuple[str, str, tuple[str, ...]]]:
    with pytest.raises(CompileError) as info:
        ss.load(src, name="slip.ss")
    return [(d.code, d.message, d.help) for d in info.value.diagnostics]


def test_a_misspelled_call_in_a_loop_is_one_error() -> None:
    found = diagnostics("dim D = 4\ndim L = 2\nmodel B:\n    param w: [D D] = zeros()\nmodel N:\n    blocks: [L] B\n"
                        "fn f(m: N, x: [b D]) -> [b D]:\n    for block in m.blocks:\n"
                        "        x = x + layer_nrom(x @ block.w, over=D)\n    return x\n")
    assert [(c, m) for c, m, _ in found] == [("E0201", "unknown function `layer_nrom`")], found
    assert "did you mean `layer_norm`?" in found[0][2]


@pytest.mark.parametrize("expr", ["x[0:2]", "x[:2]", "x[1:]"])
def test_slicing_is_said_to_be_outside_the_language(expr: str) -> None:
    [(code, message, help)] = diagnostics(f"dim D = 4\nfn f(x: [b D]) -> [b 2] = {expr}\n")
    assert code == "E0404" and "slicing" in message
    assert "window(x, start, size, over=D)" in help[0] and "first(x, n, over=D)" in help[0]


@pytest.mark.parametrize("params, body, wanted, unwanted", [
    ("y: [b] Index[C], x: [b] f32", "y + x", "`to(y, f32)`", "to(x, i64)"),  # never floats to ints
    ("x: [b] f32, y: [b] Index[C]", "x * y", "`to(y, f32)`", "to(x, i64)"),  # whichever side the int is
    ("w: [b] f64, x: [b] f32", "w - x", "`to(x, f64)`", "to(w, f32)"),  # floats: the right side takes the left's
])
def test_an_operators_dtype_help_converts_without_loss(params: str, body: str, wanted: str, unwanted: str) -> None:
    [(code, _, help)] = diagnostics(f"dim C = 3\nfn f({params}) -> [b] f64 = to({body}, f64)\n")
    assert code == "E0308" and wanted in help[-1] and unwanted not in " ".join(help), help


def test_a_parameters_dtype_help_never_narrows_a_value() -> None:
    found = diagnostics("fn k(x: [b] i64) -> [b] i64 = x\nfn m(x: [b] f32) -> [b] i64 = k(x)\n")
    [(code, _, help)] = found
    assert code == "E0308" and "would lose values" in help[-1] and "to(x, i64)" not in " ".join(help)
    [(_, _, widening)] = diagnostics("fn k(x: [b] f64) -> [b] f64 = x\nfn m(x: [b] f32) -> [b] f64 = k(x)\n")
    assert "`to(x, f64)`" in widening[-1]


def test_dropping_an_axis_in_rearrange_names_take_too() -> None:
    [(code, _, help)] = diagnostics("dim D = 4\nfn g(x: [b n D]) -> [b D] = rearrange(x, b n d -> b d)\n")
    assert code == "E0307" and "take(x, k, over=...)" in help[0] and "reduce" in help[0]
