"""The checker's types are what runs: arithmetic's dtypes are PyTorch's promotion, an `Index[C]`
result is a value known to lie under C, and `to` converts dtypes, per example on every device count."""

from __future__ import annotations

import contextlib
import io
import itertools
import operator
import textwrap

import pytest
import torch
from programs import LIN_HEADER

import shapescript as ss
from shapescript.errors import CompileError
from shapescript.pipeline import check_source
from shapescript.shapes import value_types as T

SS_DTYPES = {"bool": torch.bool, "i32": torch.int32, "i64": torch.int64, "f16": torch.float16,
             "f32": torch.float32, "f64": torch.float64}
TORCH_NAMES = {v: k for k, v in SS_DTYPES.items()}
# a number in .ss, the same in Python
NUMBERS = {"2": 2, "1.5": 1.5, "true": True}
# each operator, as Python applies it
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "**": operator.pow}


def codes(source: str) -> list[str]:
    with pytest.raises(CompileError) as info:
        check_source(source, "p.ss")
    return [d.code for d in info.value.diagnostics]


def torch_dtype(make) -> torch.dtype | None:
    """The dtype torch gives, or None where torch refuses the operation."""
    try:
        return make().dtype
    except RuntimeError:
        return None


def tensor_number_cases() -> list[tuple[str, str, str, bool]]:
    return list(itertools.product(SS_DTYPES, NUMBERS, OPS, (False, True)))


def test_a_tensor_and_a_number_are_typed_as_pytorch_runs_them() -> None:
    """Every dtype with every kind of number under every operator, both orders: the checked dtype
    is the dtype the generated code's result has, and torch's own; where torch refuses, so does the
    checker (E0308). Arithmetic of a bool tensor with a bool is refused by design (use and/or/not)."""
    accepted: list[tuple[str, str, str, torch.dtype]] = []
    for k, (dtype, number, op, number_first) in enumerate(tensor_number_cases()):
        expr = f"{number} {op} a" if number_first else f"a {op} {number}"
        a = torch.ones(3, dtype=SS_DTYPES[dtype])
        value = NUMBERS[number]
        expected = torch_dtype(lambda: OPS[op](value, a) if number_first else OPS[op](a, value))
        if expected is None or (dtype == "bool" and number == "true"):
            assert codes(f"fn f(a: [n] {dtype}) -> [n] f32 = {expr}\n") == ["E0308"], expr
            continue
        source = f"fn f(a: [n] {dtype}) -> [n] {TORCH_NAMES[expected]} = {expr}\n"
        checked = check_source(source, "p.ss")  # the declared result is torch's dtype: E0305 otherwise
        body = checked.fns["f"].node.body[-1].value
        assert checked.type_of(body).dtype == TORCH_NAMES[expected], (dtype, expr)
        accepted.append((f"f{k}", dtype, f"fn f{k}(a: [n] {dtype}) -> [n] {TORCH_NAMES[expected]} = {expr}",
                         expected))
    prog = ss.load("\n\n".join(src for _, _, src, _ in accepted) + "\n", name="p.ss")
    for name, dtype, src, expected in accepted:
        result = getattr(prog, name)(torch.ones(3, dtype=SS_DTYPES[dtype]))
        assert result.dtype == expected, src
    assert len(accepted) > 100
    # two tensors: one dtype, kept (bools do logic, not arithmetic); two dtypes, refused
    for (left, right), op in itertools.product(itertools.product(SS_DTYPES, SS_DTYPES), OPS):
        if left != right or left == "bool":
            assert codes(f"fn f(a: [n] {left}, b: [n] {right}) -> [n] {left} = a {op} b\n") == ["E0308"]
            continue
        ones = torch.ones(3, dtype=SS_DTYPES[left])
        expected = OPS[op](ones, ones).dtype
        source = f"fn f(a: [n] {left}, b: [n] {right}) -> [n] {TORCH_NAMES[expected]} = a {op} b\n"
        assert ss.load(source, name="p.ss").f(ones, ones).dtype == expected, source


def test_the_issue_example_bool_times_float_is_f32() -> None:
    prog = ss.load("fn f(hit: [n] bool) -> [n] f32 = hit * 1.0\n", name="p.ss")
    hit = torch.tensor([True, False, True])
    assert torch.equal(prog.f(hit), hit * 1.0) and prog.f(hit).dtype == torch.float32
    assert codes("fn f(hit: [n] bool) -> [n] bool = hit * 1.0\n") == ["E0305"]


def test_a_number_from_a_parameter_promotes_as_a_literal_does() -> None:
    prog = ss.load("fn f(hit: [n] bool, k: float) -> [n] f32 = hit * k\n\n"
                   "fn g(ids: [n] i32, k: int) -> [n] i32 = ids + k\n", name="p.ss")
    assert prog.f(torch.tensor([True, False]), 2.0).dtype == torch.float32
    assert prog.g(torch.tensor([1, 2], dtype=torch.int32), 3).dtype == torch.int32


# ---- an Index result is a value known to be in range -----------------------------------------

def test_returning_a_plain_integer_as_an_index_is_e0309() -> None:
    source = "dim K = 3\n\nfn f(y: [b] i64) -> [] Index[K] = sum(y)\n"
    with pytest.raises(CompileError) as info:
        check_source(source, "p.ss")
    (d,) = info.value.diagnostics
    assert d.code == "E0309" and (d.span.line, d.span.col) == (3, 35)
    assert "`f`'s result is [] Index[K]" in d.message
    # another bound, and a plain integer from a statement body
    assert codes("dim K = 3\ndim C = 5\n\nfn f(x: [b C]) -> [b] Index[K] = argmax(x, over=C)\n") == ["E0309"]
    assert codes("dim K = 3\n\nfn f(y: [b] i64) -> [b] Index[K]:\n    z = y + 1\n    return z\n") == ["E0309"]
    # what is known to be in range still compiles, and runs
    prog = ss.load(textwrap.dedent("""\
        dim K = 3

        fn best(x: [b K]) -> [b] Index[K] = argmax(x, over=K)

        fn again(x: [b K]) -> [b] Index[K]:
            y = best(x)
            return y

        fn worst(x: [b n]) -> [b] Index[n] = argmin(x, over=n)
        """), name="p.ss")
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(prog.best(x), x.argmax(1)) and torch.equal(prog.again(x), x.argmax(1))
    assert torch.equal(prog.worst(x), x.argmin(1))


# ---- to(x, dtype) -----------------------------------------------------------------------------

@pytest.mark.parametrize("source,target", list(itertools.product(SS_DTYPES, SS_DTYPES)))
def test_to_converts_as_torch_does(source: str, target: str) -> None:
    prog = ss.load(f"fn f(x: [n m] {source}) -> [n m] {target} = to(x, {target})\n", name="p.ss")
    x = torch.tensor([[0.0, 1.0, -2.5], [3.75, 0.0, 7.0]]).to(SS_DTYPES[source])
    result = prog.f(x)
    assert result.dtype == SS_DTYPES[target] and torch.equal(result, x.to(SS_DTYPES[target]))


def test_to_drops_the_index_bound_and_refuses_what_is_not_a_dtype() -> None:
    c = check_source("dim K = 3\n\nfn f(x: [b K]) -> [b] i64 = to(argmax(x, over=K), i64)\n", "p.ss")
    assert c.type_of(c.fns["f"].node.body[-1].value).show() == "[b] i64"
    assert codes("dim K = 3\n\nfn f(x: [b K]) -> [b] Index[K] = to(argmax(x, over=K), i64)\n") == ["E0309"]
    assert codes("fn f(x: [n]) -> [n] = to(x, float)\n") == ["E0401"]
    assert codes("fn f(x: [n]) -> [n] = to(x, 2)\n") == ["E0401"]
    assert codes('fn f(x: [n]) -> [] = to("2", f32)\n') == ["E0401"]
    # A number becomes a [] tensor of that dtype, as torch.tensor(2, dtype=...) makes it.
    two = ss.load("fn f(x: [n]) -> [] f64 = to(2, f64)\n", name="p.ss").f(torch.ones(3))
    assert two.dtype == torch.float64 and two.shape == () and two.item() == 2.0


ACCURACY = LIN_HEADER.replace("std=0.1", "std=1.0") + textwrap.dedent("""\

    fn accuracy(m: Lin, batch: [b] Ex) -> [] = mean(to(argmax(batch.x @ m.w, over=C) == batch.y, f32))

    fn hits(m: Lin, batch: [b] Ex) -> [b] f32 = to(argmax(batch.x @ m.w, over=C) == batch.y, f32)
    """)


@pytest.mark.parametrize("devices", ["cpu", "cpu[0 1]"])
def test_accuracy_with_to_matches_pytorch_on_one_and_two_devices(devices: str) -> None:
    g = torch.Generator().manual_seed(1)
    batch = {"x": torch.randn(7, 4, generator=g), "y": torch.randint(0, 3, (7,), generator=g)}
    prog = ss.load(ACCURACY, devices=devices, name="acc.ss")
    try:
        m = prog.Lin.init(seed=0)
        w = m.state_dict()["w"]
        hit = (batch["x"] @ w).argmax(1) == batch["y"]
        accuracy = prog.accuracy(m, batch)
        assert accuracy.dtype == torch.float32 and accuracy.shape == ()
        assert float(accuracy) == pytest.approx(float(hit.float().mean()), abs=1e-6)
        assert 0 < float(accuracy) < 1  # a mix of hits and misses: the mean is really over the whole batch
        hits = prog.hits(m, batch)
        assert hits.dtype == torch.float32 and torch.equal(hits, hit.to(torch.float32))
    finally:
        prog.stop()


# ---- plain numbers: Python's types (holes found by tests/compiler/test_types_runtime.py) -------

NUMBER_CASES = ["2 ** -1", "2 ** 3", "2 ** 0", "true ** -2", "3 ** true", "0.5 ** 2", "2 ** -0.5",
                "-true", "-true * 2", "true + true", "1 / 2", "2 * 3 - 1"]


@pytest.mark.parametrize("expr", NUMBER_CASES)
def test_arithmetic_of_plain_numbers_has_python_s_type(expr: str) -> None:
    """`2 ** -1` is 0.5 in Python, a float, and `-true` is -1, an int: the checker's type of each
    expression is the type of Python's own value, and the debug build finds the same at run time."""
    value = eval(expr.replace("true", "True"))
    expected = {int: "int", float: "float"}[type(value)]
    checked = check_source(f"fn f() -> [] = {expr}\n", "p.ss")
    assert checked.type_of(checked.fns["f"].node.body[-1].value).show() == expected, expr
    prog = ss.load(f"fn f(x: [n] i64) -> [n] {'f32' if expected == 'float' else 'i64'} = x * ({expr})\n",
                   name="p.ss", check_types=True)
    result = prog.f(torch.tensor([1, 2]))
    assert torch.equal(result, torch.tensor([1, 2]) * value)


def test_a_whole_power_needs_an_exponent_of_known_sign() -> None:
    """`2 ** k` of an int k is an int or a float as k's sign goes: refused (E0308); a dim's size
    is positive, so `2 ** n` is an int."""
    assert codes("fn f(x: [n], k: int) -> [n] = x * 2 ** k\n") == ["E0308"]
    prog = ss.load("fn f(x: [n] i64) -> [n] i64 = x * 2 ** n\n", name="p.ss", check_types=True)
    assert torch.equal(prog.f(torch.tensor([1, 2, 3])), torch.tensor([8, 16, 24]))
    assert ss.load("fn f(x: [n], k: int) -> [n] = x * 2.0 ** k\n", name="p.ss").f(torch.ones(2), -1).tolist() == [0.5, 0.5]


@pytest.mark.parametrize("dtype,fill", [("f16", "-1e9"), ("f16", "-1e4"), ("f16", "70000"), ("bf16", "-1e9"),
                                        ("f32", "-1e9"), ("i32", "-1e10"), ("i32", "-5")])
def test_masked_fill_refuses_a_value_its_dtype_can_t_hold(dtype: str, fill: str) -> None:
    """torch refuses to fill an f16 tensor with -1e9; so does the checker (E0401), exactly where torch does."""
    x = torch.ones(2, 2, dtype={**SS_DTYPES, "bf16": torch.bfloat16}[dtype])
    mask = torch.ones(2, 2).triu(1).bool()
    try:
        expected = x.masked_fill(mask, float(fill))
    except RuntimeError:
        expected = None
    source = f"fn f(x: [n n] {dtype}) -> [n n] {dtype} = masked_fill(x, causal(n, n), {fill})\n"
    if expected is None:
        assert codes(source) == ["E0401"], source
    else:
        assert torch.equal(ss.load(source, name="p.ss", check_types=True).f(x), expected), source


@pytest.mark.parametrize("dtype", ["i32", "i64", "bool"])
@pytest.mark.parametrize("exponent", ["-1", "-2", "-true", "0", "2", "true", "n", "k", "0.5", "(2 ** -1)"])
def test_an_integer_tensor_to_a_whole_power_is_refused_where_torch_refuses(dtype: str, exponent: str) -> None:
    """torch refuses integers (and bools) to negative whole powers at run time; the checker refuses
    them before (E0308), and a whole exponent whose sign it can't know (`k: int`) too. Every other
    power compiles and runs, with torch's dtype."""
    x = torch.tensor([1, 2, 3]).to(SS_DTYPES[dtype])
    k = 2
    value = {"n": 3, "k": k, "-true": -1, "true": True, "(2 ** -1)": 0.5}.get(exponent)
    value = float(exponent) if value is None and "." in exponent else int(exponent) if value is None else value
    expected = torch_dtype(lambda: x ** value)
    source = f"fn f(x: [n] {dtype}, k: int) -> [n] f64 = to(x ** {exponent}, f64)\n"
    if expected is None or exponent == "k" or (dtype == "bool" and exponent == "true"):  # bool with bool: logic
        assert codes(source) == ["E0308"], source
        return
    result = ss.load(source, name="p.ss", check_types=True).f(x, k)
    assert torch.equal(result, (x ** value).to(torch.float64)), source


# ---- library operations: torch's dtypes, and torch's refusals ----------------------------------

# each operation on `x: [m n]`, as .ss text and as torch computes it
LIBRARY_OPS = {
    "cumsum(x, over=n)": lambda x: torch.cumsum(x, dim=1),
    "abs(x)": torch.abs,
    "argmax(x, over=n)": lambda x: torch.argmax(x, dim=1),
    "argmin(x, over=n)": lambda x: torch.argmin(x, dim=1),
    "topk(x, 1, over=n)": lambda x: torch.topk(x, 1, dim=1).values,
    "clamp(x, min=0.5)": lambda x: torch.clamp(x, min=0.5),
    "clamp(x, min=1)": lambda x: torch.clamp(x, min=1),
    "clamp(x, min=0, max=1.5)": lambda x: torch.clamp(x, min=0, max=1.5),
    "where(x == x, x, 1)": lambda x: torch.where(x == x, x, 1),
    "where(x == x, true, x)": lambda x: torch.where(x == x, True, x),
    "where(x == x, true, false)": lambda x: torch.where(x == x, True, False),
    "where(x == x, true, 2)": lambda x: torch.where(x == x, True, 2),
}


@pytest.mark.parametrize("dtype", ["bool", "i32", "i64", "f16", "f32"])
@pytest.mark.parametrize("op", list(LIBRARY_OPS))
def test_library_operations_are_typed_as_torch_runs_them(op: str, dtype: str) -> None:
    """Where torch refuses an operation on a dtype, the checker refuses it (E0308); where the checker
    accepts it, the result's checked dtype is torch's (cumsum of i32 is i64 as sum's is; clamp of an
    integer tensor with a float bound is f32; where of a bool tensor and an int is i64), and the
    debug build, which checks every value, runs."""
    x = torch.tensor([[1, 0, 3], [2, 5, 0]]).to(SS_DTYPES[dtype])
    torch_result = LIBRARY_OPS[op]
    expected = torch_dtype(lambda: torch_result(x))
    source = f"fn f(x: [m n] {dtype}):\n    print({op})\n"
    try:
        checked = check_source(source, "p.ss")
    except CompileError as err:
        assert expected is None and err.codes == ["E0308"], (source, err.codes)
        return
    assert expected is not None, f"the checker accepts what torch refuses: {source}"
    value = checked.fns["f"].node.body[0].expr.args[0].value
    typed = checked.type_of(value)
    typed = typed.items[0] if isinstance(typed, T.TupleT) else typed
    assert typed.dtype == TORCH_NAMES[expected], (source, typed.show())
    with contextlib.redirect_stdout(io.StringIO()):
        ss.load(source, name="p.ss", check_types=True).f(x)
