"""Dims defined from other dims (`dim D = H * Dh`) and initializers whose arguments are constant
expressions (`normal(std=0.02 / sqrt(2 * L))`): sizes, types, reshapes and initial values against
hand-written PyTorch, and each error with its code."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from support import ROOT

import shapescript as ss
from shapescript.errors import CompileError
from shapescript.pipeline import check_source, python_module

HEADS = textwrap.dedent("""\
    dim D = H * Dh
    dim H = 2
    dim Dh = 3
    dim F = 4 * D

    model M:
        param w: [D F] = normal(std=0.1)

    fn merge(x: [n H Dh]) -> [n D] = rearrange(x, n h d -> n (h d))

    fn split_heads(x: [n D]) -> [n H Dh] = rearrange(x, n (h d) -> n h d, h=H)

    fn grouped(x: [n (H Dh)]) -> [n D] = x

    fn widen(m: M, x: [n (H Dh)]) -> [n 4*H*Dh] = x @ m.w

    fn row_sums(x: [n (H Dh)]) -> [n] = sum(x, over=D)
    """)


def errors(source: str, dims: dict[str, int] | None = None) -> CompileError:
    with pytest.raises(CompileError) as info:
        check_source(source, "t.ss", dims=dims)
    return info.value


# ---- derived dims -----------------------------------------------------------------------------

def test_derived_sizes_are_computed_in_any_order_of_declaration() -> None:
    checked = check_source(HEADS, "heads.ss")
    assert checked.dim_values == {"D": 2 * 3, "H": 2, "Dh": 3, "F": 4 * 2 * 3}


def test_derived_dims_reshape_as_torch_does() -> None:
    prog = ss.load(HEADS, name="heads.ss")
    x = torch.randn(5, 2, 3)
    assert torch.equal(prog.merge(x), x.reshape(5, 6))
    flat = torch.randn(5, 6)
    assert torch.equal(prog.split_heads(flat), flat.reshape(5, 2, 3))
    assert torch.equal(prog.grouped(flat), flat)
    assert torch.allclose(prog.row_sums(flat), flat.sum(dim=1))
    m = prog.M.init(seed=0)
    assert m.w.shape == (6, 24)
    assert torch.allclose(prog.widen(m, flat), flat @ m.w)


def test_a_derived_dim_takes_the_sizes_given_when_loading() -> None:
    source = "dim H\ndim Dh = 4\ndim D = H * Dh\n\nmodel M:\n    param w: [D] = zeros()\n"
    prog = ss.load(source, dims={"H": 3}, name="heads.ss")
    assert prog.checked.dim_values["D"] == 3 * 4
    assert prog.namespace["DIMS"]["D"] == 3 * 4  # the module's own table of sizes
    assert prog.M.init(seed=0).w.shape == (12,)
    assert prog.device_table.models["M"].bytes == 12 * 4  # f32


def test_the_relation_is_symbolic_even_without_sizes() -> None:
    """Unsized parts: `[n (H Dh)]` still is `[n D]`; the build names only the dims to size."""
    source = "dim H\ndim Dh\ndim D = H * Dh\n\nfn f(x: [n (H Dh)]) -> [n D] = x\n"
    checked = check_source(source, "t.ss")
    assert checked.dim_values["D"] is None
    with pytest.raises(CompileError) as info:
        python_module(checked)
    assert [d.message for d in info.value.diagnostics] == ["dim `H` has no size", "dim `Dh` has no size"]


def test_a_derived_dim_is_not_an_equal_sized_declared_one() -> None:
    """Dims match by name: D = H * Dh is 6, and so is E, but `[D]` isn't `[E]`."""
    err = errors("dim H = 2\ndim Dh = 3\ndim D = H * Dh\ndim E = 6\n\nfn f(x: [D]) -> [E] = x\n")
    assert err.codes == ["E0305"] and "dim 0 is D, not E" in err.diagnostics[0].label, str(err)


def test_a_dim_defined_from_itself() -> None:
    err = errors("dim A = 2 * B\ndim B = A + 1\ndim C = A * 2\n")
    assert err.codes == ["E0314"]  # C only uses the cycle: one error
    d = err.diagnostics[0]
    assert d.line == 1 and "`A`" in d.message and "the cycle: A -> B -> A" in d.help
    assert errors("dim A = A\n").codes == ["E0314"]


def test_an_unknown_dim_in_a_definition() -> None:
    err = errors("dim H = 2\ndim D = H * Dhh\ndim Dh = 3\n")
    assert err.codes == ["E0201"]
    d = err.diagnostics[0]
    assert (d.line, d.column) == (2, 13) and "did you mean `Dh`?" in d.help


@pytest.mark.parametrize(("definition", "shown"), [("H - 3", "is -1 with H = 2"), ("H / 3", "is 2/3 with H = 2"),
                                                    ("H - H", "is 0")])
def test_a_definition_that_isnt_a_size(definition: str, shown: str) -> None:
    err = errors(f"dim H = 2\ndim D = {definition}\n")
    assert err.codes == ["E0310"]
    assert shown in err.diagnostics[0].message


def test_a_size_too_small_given_when_loading_for_a_part() -> None:
    err = errors("dim V\ndim D = V - 100\n", dims={"V": 50})
    assert err.codes == ["E0310"] and "is -50 with V = 50" in err.diagnostics[0].message


def test_a_size_given_for_a_derived_dim_is_refused_even_an_equal_one() -> None:
    source = "dim H = 2\ndim Dh = 4\ndim D = H * Dh\n"
    for size in (8, 9):
        err = errors(source, dims={"D": size})
        assert err.codes == ["E0202"]
        assert "give the size of `H` or `Dh` instead" in err.diagnostics[0].help


def test_the_command_line_refuses_a_size_for_a_derived_dim(tmp_path) -> None:
    path = tmp_path / "heads.ss"
    path.write_text(HEADS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "shapescript.cli", "check", str(path), "--dim", "D=6"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 1 and "error[E0202]" in run.stderr and "Traceback" not in run.stderr


# ---- initializers with constant expressions ---------------------------------------------------

SCALED = textwrap.dedent("""\
    dim D = 8
    dim L = 3

    model M:
        param w: [D D] = normal(std=STD)
        param u: [D] = uniform(low=-1 / sqrt(D), high=1 / D ** 0.5)
    """)


def test_an_expression_initializes_as_its_number_written_out() -> None:
    """The same tensors as a program with the std written as a literal, and as torch draws them."""
    std = 0.02 / math.sqrt(2 * 3)
    computed = ss.load(SCALED.replace("STD", "0.02 / sqrt(2 * L)"), name="a.ss").M.init(seed=7)
    literal = ss.load(SCALED.replace("STD", repr(std)), name="b.ss").M.init(seed=7)
    assert torch.equal(computed.w, literal.w) and torch.equal(computed.u, literal.u)
    g = torch.Generator().manual_seed(7)
    w = torch.empty(8, 8).normal_(0.0, std, generator=g)
    u = torch.empty(8).uniform_(-1 / math.sqrt(8), 1 / math.sqrt(8), generator=g)
    assert torch.equal(computed.w, w) and torch.equal(computed.u, u)


def test_an_expression_uses_the_sizes_given_when_loading() -> None:
    source = SCALED.replace("dim L = 3", "dim L").replace("STD", "0.02 / sqrt(2 * L)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # L has no size in the program: nothing is replaced
        m = ss.load(source, dims={"L": 50}, name="a.ss").M.init(seed=1)
    w = torch.empty(8, 8).normal_(0.0, 0.02 / math.sqrt(100), generator=torch.Generator().manual_seed(1))
    assert torch.equal(m.w, w)


@pytest.mark.parametrize(("std", "message"), [
    ("0.1 * w", "`w` is a param of the model"),
    ("1.0 / n", "`n` isn't a declared dim"),
    ("1.0 / Dd", "`Dd` isn't a declared dim"),
    ("1 / (L - 3)", "a division by zero"),
    ("sqrt(-L)", "`sqrt((-3))` has no value"),
    ("log(0)", "`log(0)` has no value"),
    ("relu(1.0)", "`relu` isn't a constant number"),
    ("sqrt(1, 2)", "`sqrt` takes one number"),
])
def test_an_argument_that_isnt_a_constant(std: str, message: str) -> None:
    err = errors(SCALED.replace("STD", std))
    assert err.codes == ["E0407"], str(err)
    assert message in err.diagnostics[0].message
    assert err.diagnostics[0].help  # what to write instead


def test_a_misspelled_dim_in_an_initializer_is_named() -> None:
    err = errors(SCALED.replace("STD", "1.0 / Dd"))
    assert "did you mean `D`?" in err.diagnostics[0].help


def test_a_negative_std_from_an_expression() -> None:
    assert errors(SCALED.replace("STD", "0.1 - L")).codes == ["E0310"]
