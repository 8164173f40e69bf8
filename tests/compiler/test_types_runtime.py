"""Types are the truth: for random well-typed programs, every value the generated code computes has
the shape and dtype the checker gave its expression.

Programs come from the fuzzing grammar without deliberate mistakes (`ProgramGen(r, mistakes=0)`),
run on one device (a `devices` line is overridden by `cpu`), built with `check_types=True`: every
expression's value, and every parameter, passes through runtime/typecheck.py's `expect`, which
raises ShapeError where the value differs from the checked type. Each function is called with
arguments made from its signature alone: tensors of the declared shapes and dtypes with each
generic dim bound to a random size from 2 to 4 (`topk(x, 2, over=n)` needs n >= 2), models from `.init(seed=...)`, batches as dicts,
optimizers, modes, datasets and sinks as the API takes them; extern fns get a Python function of
their declared type. The seeds are fixed, so CI runs the same programs each time.

    python tests/compiler/test_types_runtime.py [N [FIRST]]   # N programs from seed FIRST; lists every failure
"""

from __future__ import annotations

import random
import sys
import textwrap
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch

# Run as a script too (see above): the repository's root, for the package, and tests/, for `fuzzing`.
TESTS = Path(__file__).resolve().parents[1]
for path in (TESTS.parent, TESTS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from fuzzing.grammar import ProgramGen  # noqa: E402
from fuzzing.rand import RandomRand  # noqa: E402

import shapescript as ss  # noqa: E402
from shapescript.check.program import FnInfo  # noqa: E402
from shapescript.dtypes import INT_DTYPES  # noqa: E402
from shapescript.errors import CompileError, ShapeError  # noqa: E402
from shapescript.runtime import calls, sinks, typecheck  # noqa: E402
from shapescript.shapes import dims as D  # noqa: E402
from shapescript.shapes import value_types as T  # noqa: E402

PROGRAMS = 300  # programs whose every function was called, at least
SEEDS = range(330)  # ~1% don't compile, a few have a function that can't be called
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
          "i32": torch.int32, "i64": torch.int64, "bool": torch.bool}
DATASET_ITEMS = 10  # batches of 8 leave a last batch of 2: a loop's batch axis changes size


class CannotCall(Exception):
    """A function's arguments can't be made from its signature (a size that isn't a whole number)."""


class Arguments:
    """Arguments for one call of one function, made from its parameters' types."""

    def __init__(self, prog: ss.Program, fn: FnInfo, rng: random.Random, seed: int) -> None:
        self.prog, self.fn, self.rng, self.seed = prog, fn, rng, seed
        self.torch_rng = torch.Generator().manual_seed(seed)
        self.sizes: dict[sympy.Symbol, int] = {}  # each generic dim's size for this call
        self.models: dict[str, Any] = {}  # one model of each type, shared by its optimizer

    def make(self) -> list[Any]:
        return [self.value(p.ty) for p in self.fn.params]

    def size(self, d: D.Dim) -> int:
        for s in sorted(d.free_symbols, key=str):
            if D.is_generic(s) and s not in self.sizes:
                self.sizes[s] = self.rng.randint(2, 4)  # topk(x, 2, over=n) needs n >= 2
        fixed = {s: self.prog.checked.dim_values[s.name] for s in d.free_symbols if not D.is_generic(s)}
        value = sympy.sympify(d.xreplace({**self.sizes, **fixed}))
        if not (value.is_Integer and value > 0):
            raise CannotCall(f"size {D.show(d)} is {value}")
        return int(value)

    def tensor(self, t: T.TensorT, lead: tuple[int, ...] = ()) -> torch.Tensor:
        shape = lead + tuple(self.size(a.size) for a in t.axes)
        if t.index is not None:
            return torch.randint(0, self.size(t.index), shape, generator=self.torch_rng)
        if t.dtype == "bool":
            return torch.randint(0, 2, shape, generator=self.torch_rng).bool()
        if t.dtype in INT_DTYPES:
            return torch.randint(-3, 6, shape, generator=self.torch_rng).to(DTYPES[t.dtype])
        return torch.randn(shape, generator=self.torch_rng).to(DTYPES[t.dtype])

    def model(self, t: T.ModelT) -> Any:
        if t.name not in self.models:
            self.models[t.name] = getattr(self.prog, t.name).init(seed=self.seed)
        return self.models[t.name]

    def value(self, t: T.Ty) -> Any:
        if isinstance(t, T.TensorT):
            return self.tensor(t)
        if isinstance(t, T.BatchT):
            lead = tuple(self.size(a.size) for a in t.axes)
            return {name: self.tensor(field, lead) for name, field in t.data.fields.items()}
        if isinstance(t, T.ModelT):
            return self.model(t)
        if isinstance(t, T.OptT):
            make = ss.adamw if t.kind == "AdamW" else ss.sgd
            return make(self.model(t.model), lr=1e-3)
        if isinstance(t, T.DatasetT):
            return ss.TensorDataset(**{name: self.tensor(field, (DATASET_ITEMS,))
                                       for name, field in t.data.fields.items()})
        if t == T.SINK:
            return sinks.memory()
        if t == T.NamedT("Mode"):
            return ss.Train(seed=self.seed) if self.rng.random() < 0.5 else ss.Eval
        if isinstance(t, T.ScalarT):
            return {"int": 2, "float": 0.5, "bool": True, "str": "s"}[t.kind]
        raise CannotCall(f"no argument of type {t.show()}")


def extern_module() -> types.ModuleType:
    """The grammar's extern fn `ext` (`"mod.ext"`), as Python: the identity, a value of its type."""
    module = types.ModuleType("mod")
    module.ext = lambda x: x.clone()  # type: ignore[attr-defined]
    return module


def run_program(seed: int) -> tuple[str, str]:
    """('called' | 'skipped' | 'failed', details) for the grammar program of `seed`."""
    source = ProgramGen(RandomRand(seed), mistakes=0).program()
    try:
        prog = ss.load(source, devices="cpu", name="fuzz.ss", check_types=True)
    except CompileError as err:
        return "skipped", f"doesn't compile: {err.codes}"
    rng = random.Random(seed)
    for fn in prog.checked.fns.values():
        if fn.kind != "fn":
            continue
        try:
            args = Arguments(prog, fn, rng, seed).make()
        except CannotCall as why:
            return "skipped", f"`{fn.name}`: {why}"
        try:
            getattr(prog, fn.name)(*args)
        except Exception:
            return "failed", f"seed {seed}, calling `{fn.name}`:\n{traceback.format_exc()}\n{source}"
    return "called", ""


def run_programs(seeds: range) -> tuple[int, list[str]]:
    """How many programs had every function called, and the failures."""
    called, failures = 0, []
    for seed in seeds:
        outcome, details = run_program(seed)
        called += outcome == "called"
        if outcome == "failed":
            failures.append(details)
    return called, failures


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints land in tmp_path; `mod.ext` is the grammar's extern fn (resolved afresh)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "mod", extern_module())
    monkeypatch.setattr(calls, "_FUNCTIONS", {})


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the checks that run (the generated code looks `_tc.expect` up at each call)."""
    count = [0]
    expect: Callable[..., Any] = typecheck.expect

    def counted(*args: Any) -> Any:
        count[0] += 1
        return expect(*args)

    monkeypatch.setattr(typecheck, "expect", counted)
    return count


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*degrees of freedom:UserWarning")  # std and var of one value
def test_values_have_their_checked_types(sandbox: None, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    checks = counting(monkeypatch)
    called, failures = run_programs(SEEDS)
    assert not failures, f"{len(failures)} programs failed; the first:\n{failures[0]}"
    assert called >= PROGRAMS, f"only {called} of {len(SEEDS)} programs could be called"
    assert checks[0] >= 20 * PROGRAMS, checks[0]  # the values really were checked


# ---- the check itself can fail, naming the .ss line ------------------------------------------

LIE = textwrap.dedent("""\
    dim D = 3

    fn f(x: [n D]) -> [n D]:
        h = gelu(x) + x
        return h * 2.0
    """)


@pytest.mark.parametrize("lie,said", [
    (lambda x, **kw: x[:-1], "is [1, 3] f32 at run time, but its type is [n D] f32: dim 0 is 1, not n = 2"),
    (lambda x, **kw: x.double(), "is [2, 3] f64 at run time, but its type is [n D] f32"),
    (lambda x, **kw: x.sum(), "is [] f32 at run time, but its type is [n D] f32"),
])
def test_an_op_that_lies_is_caught_at_its_line(monkeypatch: pytest.MonkeyPatch, lie, said: str) -> None:
    """An operation whose result differs from its type (gelu, patched to lie) raises ShapeError
    naming the .ss line and expression; the built module without checks runs on, unaware."""
    x = torch.randn(2, 3)
    honest = ss.load(LIE, name="lie.ss", check_types=True)
    assert torch.allclose(honest.f(x), (torch.nn.functional.gelu(x) + x) * 2.0)
    monkeypatch.setattr(torch.nn.functional, "gelu", lie)
    with pytest.raises(ShapeError) as info:
        ss.load(LIE, name="lie.ss", check_types=True).f(x)
    assert str(info.value).startswith(f"lie.ss:4:9: `gelu(x)` {said}"), str(info.value)
    unchecked = ss.load(LIE, name="lie.ss")
    if lie(x).shape[-1:] == (3,):  # what still broadcasts runs on, wrong, without the checks
        unchecked.f(x)


def test_an_index_out_of_its_bound_and_a_number_of_another_kind_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """`argmax(x, over=C)` is `Index[C]`: a value C or above is caught; so is a float where an int is typed."""
    prog = ss.load("dim C = 3\n\nfn f(x: [b C]) -> [b] Index[C] = argmax(x, over=C)\n\n"
                   "fn g(x: [b C]) -> [b C] = x * (2 ** 2)\n", name="i.ss", check_types=True)
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(prog.f(x), x.argmax(1)) and torch.equal(prog.g(x), x * 4)
    argmax = torch.argmax
    monkeypatch.setattr(torch, "argmax", lambda t, dim: argmax(t, dim=dim) + 3)
    with pytest.raises(ShapeError, match=r"i\.ss:3:34: `argmax\(x, over=C\)` holds [3-5], outside its type's "
                                         r"Index\[C\] with C = 3"):
        prog.f(x)
    typecheck_expect = typecheck.expect
    monkeypatch.setattr(typecheck, "expect", lambda value, spec, *rest: typecheck_expect(
        float(value) if spec == ("scalar", "int") and value == 2 else value, spec, *rest))
    with pytest.raises(ShapeError, match=r"i\.ss:5:32: `2` is a float 2\.0 at run time, not an int"):
        prog.g(x)


def test_a_generic_dim_is_bound_once_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """`n` takes its size from the first value that has it, per call: a later value with another
    size is caught, and the next call binds afresh."""
    prog = ss.load("fn f(x: [n], y: [m]) -> [n] = relu(x)\n", name="g.ss", check_types=True)
    assert torch.equal(prog.f(torch.ones(2), torch.ones(5)), torch.ones(2))
    assert torch.equal(prog.f(torch.ones(4), torch.ones(1)), torch.ones(4))  # another call, other sizes
    monkeypatch.setattr(torch, "relu", lambda x: torch.ones(3))
    with pytest.raises(ShapeError, match=r"g\.ss:1:31: `relu\(x\)` is \[3\] f32 at run time, but its type is "
                                         r"\[n\] f32: dim 0 is 3, not n = 2, bound by the value at g\.ss:1:6"):
        prog.f(torch.ones(2), torch.ones(5))


def test_a_loop_s_batches_may_differ_in_size() -> None:
    """Each batch of a loop has its own `b` (the last one is smaller); within a batch it is fixed."""
    prog = ss.load(textwrap.dedent("""\
        dim D = 2

        data Ex:
            x: [D]

        fn totals(data: Dataset[Ex], log: Sink):
            for batch in data |> batches(4):
                write(log, logs(total=sum(batch.x * 2.0), half_values=sum(to(batch.x > batch.x, f32) + 0.5)))
        """), name="loop.ss", check_types=True)
    x = torch.randn(10, 2, generator=torch.Generator().manual_seed(0))
    log = sinks.memory()
    prog.totals(ss.TensorDataset(x=x), log)
    assert [r["half_values"] for r in log.records] == [4.0, 4.0, 2.0]  # 4, 4 and 2 rows of 2 values
    assert [r["total"] for r in log.records] == pytest.approx([float(x[k:k + 4].sum() * 2) for k in (0, 4, 8)])


LOOP_CARRIED = textwrap.dedent("""\
    dim D = 2

    data Ex:
        x: [D]

    fn total(data: Dataset[Ex]) -> []:
        s = 0.0
        for batch in data |> batches(4):
            s = s + sum(batch.x)
        return s

    fn grow(x: [n], data: Dataset[Ex]) -> [n 2]:
        h = x
        for batch in data |> batches(4):
            h = repeat(h, p -> p z, z=2)
        return h
    """)


@pytest.mark.parametrize("fn, line", [("total", 9), ("grow", 15)])
def test_a_variable_a_loop_rebinds_keeps_its_type(fn: str, line: int) -> None:
    """Once a hole (a second pass read `s` as a tensor, `h` as [n 2]): now E0406 at the assignment
    that changes the type, and a total started as a tensor runs and checks clean."""
    with pytest.raises(ss.CompileError) as info:
        ss.load(LOOP_CARRIED, name="loop.ss")
    found = [d for d in info.value.diagnostics if d.line == line]
    assert [d.code for d in found] == ["E0406"] and set(info.value.codes) == {"E0406"}
    fixed = LOOP_CARRIED.replace("s = 0.0", "s = to(0.0, f32)").split("fn grow")[0]
    prog = ss.load(fixed, name="loop.ss", check_types=True)
    data = ss.TensorDataset(x=torch.arange(20.0).reshape(10, 2))
    assert prog.total(data).item() == sum(range(20))


def test_the_debug_build_only_adds_checks() -> None:
    """The normal build doesn't change; the debug build checks each value and each parameter."""
    source = "dim D = 3\n\nfn f(x: [b D], k: float) -> [b] = sum(x * k, over=D)\n"
    plain = ss.build(source)
    checked = ss.load(source, check_types=True).python_source
    assert "_tc" not in plain
    assert checked.count("_tc.expect(") == 2 + 4  # x and k on entry; x, k, x * k, the sum
    assert ss.load(source).python_source == plain


if __name__ == "__main__":  # every failure of a range of seeds, not only the first
    count = int(sys.argv[1]) if len(sys.argv) > 1 else len(SEEDS)
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    sys.modules["mod"] = extern_module()
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as folder:  # the programs' checkpoints
        os.chdir(folder)
        called, failures = run_programs(range(first, first + count))
    print("\n\n".join(failures))
    print(f"{called} of {count} programs called, {len(failures)} failed")
