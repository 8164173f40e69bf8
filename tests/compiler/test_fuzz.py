"""Fuzzing the compiler: every program gets diagnostics or a valid Python module, never a crash.

Programs of five kinds are fed to `check_source` (and, when it succeeds, to `generate` and
Python's `compile`):

1. mutants of valid programs (the README's MLP, every error-index example, the language guide's
   blocks and programs of our own that use generics, broadcasting, reductions with `over=`,
   softmax, patterns, stacks of blocks, python and extern fns, expression-bodied fns): lines
   deleted, duplicated, swapped, joined, split or re-indented, characters and tokens deleted or
   inserted, a name replaced by another, the text truncated;
2. soups of the language's tokens (and of single characters), with newlines and indentation;
3. programs grown from the grammar and the typing rules: dims, a data type, a model (with a stack
   of blocks and an embedding table now and then), functions whose bodies are built from their
   parameters by well-typed steps (operators, broadcasting, reductions, softmax, `@`,
   cross_entropy, patterns, lookups, masks, dropout, calls of earlier functions, pipes, statements
   that bind several names), the README's training functions; now and then one deliberate
   mistake, so that most programs compile and most of the others fail in the checker;
4. those programs with one mutation;
5. deep nesting and long chains (parentheses, unary minus, `**`, `+`, calls, pipes, loops).

Plus `TRICKY`, programs aimed at corners the random ones rarely reach.

The generators are in tests/fuzzing/ (imported as `fuzzing.xxx`); this file holds the property
and the tests.

A compile error must be a `CompileError` whose diagnostics each have a code `Ennnn`, a 1-based
line and column inside the source (lines as the lexer counts them), a message, and render.
A generated module must compile without warnings, define each function once, leave the names it
binds itself (DIMS, the specs, ...) to itself, and read no name that nothing binds. Anything else
is a bug of the compiler: these tests fail on it, and stay failing until the compiler is fixed.

Each property test runs a fixed number of examples, derandomized so that CI sees the same
programs (the whole file takes 20-40 s on two cores); `SHAPESCRIPT_FUZZ_EXAMPLES=20000` runs
that many per test instead. Hypothesis stops at a test's first failure; to list many bugs at once
use the hunter below.

Without pytest, tests/fuzzing/hunt.py is a bug hunter and a meter (neither is a test); this file
runs it too (`python -m tests.fuzzing.hunt ...` is the same):

    python tests/compiler/test_fuzz.py stats [N [FIRST]]  # share of programs of each kind that compile
    python tests/compiler/test_fuzz.py hunt [N [FIRST]]   # N programs of each kind (seeds FIRST...); internal
                                                          # errors grouped by where they are raised, each
                                                          # with a program made minimal by delta debugging

Measured with `stats 2000` on the compiler of 2026-11-29 09:30: grammar-directed programs 52% compile
and 48% fail in the checker (E02xx-E06xx, E18xx; under 0.5% in the parser); mutants 8% compile,
18% fail in the checker, 70% in the parser, 4% hit a compiler bug; mutated grammar programs 26%,
18%, 47%, 8%. Without the deliberate mistakes (`ProgramGen(r, mistakes=0)`) 99% of the grammar
programs compile: the generator's typing agrees with the checker's.
"""

from __future__ import annotations

import ast as pyast
import builtins
import os
import re
import signal
import sys
import threading
import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

# Run as a script too (see above): tests/, for `fuzzing`, and the repository's root, for the package.
TESTS = Path(__file__).resolve().parents[1]
for _path in (TESTS.parent, TESTS):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from fuzzing.grammar import KINDS, grammar_program  # noqa: E402
from fuzzing.mutations import CHARS, OWN_SEEDS, SEEDS  # noqa: E402
from fuzzing.rand import DrawRand, RandomRand  # noqa: E402
from fuzzing.tricky import TRICKY  # noqa: E402

from shapescript.codes import CODES  # noqa: E402
from shapescript.errors import CompileError  # noqa: E402
from shapescript.pipeline import (  # noqa: E402
    check_source,
    python_module,
)

FILE = "fuzz.ss"
EXAMPLES = int(os.environ.get("SHAPESCRIPT_FUZZ_EXAMPLES", "0") or 0)
TIME_LIMIT_S = 20  # one program; a compiler that takes longer is stuck


# ---- the property ----------------------------------------------------------------------------

class CompilerTooSlow(Exception):
    pass


@contextmanager
def time_limit(seconds: float):
    """Raise CompilerTooSlow if the block runs longer (main thread on Unix only)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise CompilerTooSlow(f"the compiler took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


CODE_RE = re.compile(r"E\d{4}")


def check_diagnostics(err: CompileError, source: str) -> None:
    assert isinstance(err.diagnostics, list) and err.diagnostics, "a CompileError without diagnostics"
    lines = source.split("\n")  # the lexer's lines
    for d in err.diagnostics:
        assert CODE_RE.fullmatch(d.code), f"bad code {d.code!r}"
        assert isinstance(d.message, str) and d.message.strip(), f"{d.code}: empty message"
        s = d.span
        assert s.file == FILE, f"{d.code}: span in file {s.file!r}"
        assert 1 <= s.line <= len(lines), f"{d.code} {d.message!r}: line {s.line} outside 1..{len(lines)}"
        width = len(lines[s.line - 1])
        assert 1 <= s.col <= width + 1, \
            f"{d.code} {d.message!r}: column {s.col} outside line {s.line} (1..{width + 1})"
        assert (s.end_line, s.end_col) >= (s.line, s.col), f"{d.code} {d.message!r}: span ends before it starts"
        assert isinstance(d.render(source), str) and isinstance(d.render(None), str)
    text = str(err)
    assert isinstance(text, str) and text


class CompilerRecursion(Exception):
    """A RecursionError, re-raised from one place: where the stack overflows varies from run to
    run, and hypothesis would take the varying places for different, flaky failures."""


def compile_program(source: str) -> str:
    """'ok', 'syntax' (E01xx) or 'check' (other codes); any other exception is a compiler bug."""
    stage, recursion = "check_source", ""
    try:
        with time_limit(TIME_LIMIT_S):
            try:
                checked = check_source(source, FILE)
            except CompileError as err:
                check_diagnostics(err, source)
                return "syntax" if all(c.startswith("E01") for c in err.codes) else "check"
            stage = "generate"
            try:  # lowering may refuse a program too (E0313, a dim without a size), with diagnostics
                python = python_module(checked)
            except CompileError as err:
                check_diagnostics(err, source)
                return "check"
        assert isinstance(python, str)
        stage = "compile"
        with warnings.catch_warnings():  # a SyntaxWarning ("'float' object is not subscriptable") is a bug too
            warnings.simplefilter("error")
            compile(python, "<gen>", "exec")
    except RecursionError as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "shapescript" in f.filename]
        where = Counter(f"{Path(f.filename).name}:{f.name}" for f in frames).most_common(3)
        recursion = f"RecursionError in {stage}, recursing through {', '.join(w for w, _ in where)}"
    if recursion:  # raised here, outside the handler, so that it carries no varying context
        raise CompilerRecursion(recursion)
    check_generated(python)
    return "ok"


def check_generated(python: str) -> None:
    """Beyond compiling: the module's functions have distinct names, no user name takes a name
    the generated module itself binds (its imports, DIMS, the specs ...), and every name a
    function reads is bound somewhere (a float literal that became `inf` isn't)."""
    tree = pyast.parse(python)
    prelude: set[str] = set()
    defs: list[pyast.FunctionDef] = []
    for node in tree.body:
        if isinstance(node, (pyast.Import, pyast.ImportFrom)):
            prelude |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (pyast.Assign, pyast.AnnAssign)):
            targets = node.targets if isinstance(node, pyast.Assign) else [node.target]
            prelude |= {n.id for t in targets for n in pyast.walk(t) if isinstance(n, pyast.Name)}
        elif isinstance(node, pyast.FunctionDef):
            defs.append(node)
    prelude.discard("annotations")  # `from __future__ import annotations`
    names = [d.name for d in defs]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"generated module defines {twice} more than once"
    clash = sorted(set(names) & prelude)
    assert not clash, f"generated function {clash} replaces the module's own {clash}"
    known = prelude | set(names) | set(dir(builtins))
    for d in defs:
        a = d.args
        local = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        local |= {n.id for n in pyast.walk(d) if isinstance(n, pyast.Name) and isinstance(n.ctx, pyast.Store)}
        shadow = sorted(local & (prelude | {"getattr"}))
        assert not shadow, f"in `{d.name}`, a local {shadow} hides the module's {shadow}"
        unbound = sorted({n.id for n in pyast.walk(d) if isinstance(n, pyast.Name)
                          and isinstance(n.ctx, pyast.Load) and n.id not in local | known})
        assert not unbound, f"`{d.name}` reads {unbound}, which nothing binds"


def outcome(source: str) -> str:
    try:
        return compile_program(source)
    except Exception:
        return "internal"


# ---- the tests ---------------------------------------------------------------------------------

try:
    from hypothesis import HealthCheck, given, note, settings
    from hypothesis import strategies as st
except ImportError:  # the hunter works without hypothesis; the tests need it (pip install -e .[test])
    if "pytest" in sys.modules:
        raise
    HealthCheck = given = note = settings = st = None  # type: ignore[assignment]

if st is not None:
    import pytest

    def fuzz_settings(default: int):
        return settings(max_examples=EXAMPLES or default, deadline=None, derandomize=True, database=None,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                               HealthCheck.filter_too_much, HealthCheck.large_base_example])

    def strategy(kind: str):
        """Half driven by hypothesis' draws (they shrink well, but lean to the first choice and to
        False), half by a seeded random.Random (uniform choices; shrinking only tries other seeds)."""
        make = KINDS[kind]
        drawn = st.composite(lambda draw: make(DrawRand(draw)))()
        seeded = st.integers(0, 2**32 - 1).map(lambda seed: make(RandomRand(seed)))
        return st.one_of(drawn, seeded)

    def test_seeds_compile() -> None:
        """The valid seeds are valid (else the mutations start from broken programs)."""
        assert compile_program(SEEDS[0]) == "ok"
        for src in OWN_SEEDS:
            assert compile_program(src) == "ok", src

    @pytest.mark.parametrize("code", sorted(CODES))
    def test_error_examples_give_diagnostics(code: str) -> None:
        assert compile_program(CODES[code].example) in ("syntax", "check", "ok")

    def fuzz_one(source: str) -> None:
        note(f"the program, as text:\n{source}")  # a seeded example is otherwise shown by its seed
        compile_program(source)

    @fuzz_settings(1000)
    @given(strategy("mutant"))
    def test_mutated_programs(source: str) -> None:
        fuzz_one(source)

    @fuzz_settings(600)
    @given(strategy("soup"))
    def test_token_soups(source: str) -> None:
        fuzz_one(source)

    @fuzz_settings(400)
    @given(st.text(alphabet=st.sampled_from(list(CHARS)) | st.characters(), max_size=80))
    def test_character_soups(source: str) -> None:
        fuzz_one(source)

    @fuzz_settings(800)
    @given(strategy("grammar"))
    def test_grammar_programs(source: str) -> None:
        fuzz_one(source)

    @fuzz_settings(800)
    @given(strategy("grammar_mutant"))
    def test_mutated_grammar_programs(source: str) -> None:
        fuzz_one(source)

    @pytest.mark.parametrize("source", TRICKY, ids=[f"tricky{k:02d}" for k in range(len(TRICKY))])
    def test_tricky_programs(source: str) -> None:
        compile_program(source)

    @fuzz_settings(150)
    @given(strategy("deep"))
    def test_deep_programs(source: str) -> None:
        fuzz_one(source)

    def test_grammar_programs_mostly_compile() -> None:
        """The generator keeps its purpose: many programs compile, many fail in the checker."""
        counts = Counter(outcome(grammar_program(RandomRand(seed))) for seed in range(300))
        assert counts["ok"] >= 100, counts
        assert counts["check"] >= 50, counts


if __name__ == "__main__":  # the bug hunter and the meter, in tests/fuzzing/hunt.py
    from fuzzing.hunt import main
    main(sys.argv[1:])
