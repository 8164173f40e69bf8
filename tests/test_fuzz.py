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

A compile error must be a `CompileError` whose diagnostics each have a code `Ennnn`, a 1-based
line and column inside the source (lines as the lexer counts them), a message, and render.
A generated module must compile without warnings, define each function once, leave the names it
binds itself (DIMS, the specs, ...) to itself, and read no name that nothing binds. Anything else
is a bug of the compiler: these tests fail on it, and stay failing until the compiler is fixed.

Each property test runs a fixed number of examples, derandomized so that CI sees the same
programs (the whole file takes 20-40 s on two cores); `SHAPESCRIPT_FUZZ_EXAMPLES=20000` runs
that many per test instead. Hypothesis stops at a test's first failure; to list many bugs at once
use the hunter below.

Without pytest, this file is a bug hunter and a meter (neither is a test):

    python tests/test_fuzz.py stats [N [FIRST]]  # share of programs of each kind that compile
    python tests/test_fuzz.py hunt [N [FIRST]]   # N programs of each kind (seeds FIRST...); internal
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
import random
import re
import signal
import sys
import threading
import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, NamedTuple, Sequence, TypeVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shapescript.check.checker import check_source  # noqa: E402
from shapescript.codes import CODES  # noqa: E402
from shapescript.errors import CompileError  # noqa: E402
from shapescript.lower.codegen import generate  # noqa: E402

X = TypeVar("X")
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
                python = generate(checked)
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


# ---- randomness: one interface over hypothesis' draw and random.Random -----------------------

class Rand:
    """What the generators need. `chance` and `choice` shrink towards False and the first item."""

    def choice(self, seq: Sequence[X]) -> X: ...
    def randint(self, lo: int, hi: int) -> int: ...
    def chance(self, p: float) -> bool: ...

    def sample(self, seq: Sequence[X], k: int) -> list[X]:
        pool, out = list(seq), []
        for _ in range(min(k, len(pool))):
            out.append(pool.pop(self.randint(0, len(pool) - 1)))
        return out


class RandomRand(Rand):
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def choice(self, seq):
        return self.rng.choice(list(seq))

    def randint(self, lo, hi):
        return self.rng.randint(lo, hi)

    def chance(self, p):
        return self.rng.random() < p


class DrawRand(Rand):
    def __init__(self, draw) -> None:
        self.draw = draw

    def choice(self, seq):
        return self.draw(st.sampled_from(list(seq)))

    def randint(self, lo, hi):
        return self.draw(st.integers(lo, hi))

    def chance(self, p):
        return self.draw(st.integers(0, 999)) >= 1000 - int(p * 1000)


# ---- seeds -----------------------------------------------------------------------------------

OWN_SEEDS = [
    # generics, broadcasting by names, reductions with over=, softmax, expression-bodied fns
    """dim D = 8
dim C = 4

fn centered(x: [b C]) -> [b C] = x - mean(x, over=C)

fn probs(x: [b n C]) -> [b n C] = softmax(x, over=C)

fn l2(x: [b D]) -> [b] = sqrt(sum(x * x, over=D))

fn affine(w: [D C], bias: [C], x: [b D]) -> [b C] = relu(x @ w + bias) * 0.5

fn chain(w: [D C], bias: [C], x: [b D]) -> [b]:
    h = affine(w, bias, x)
    p = h |> log_softmax(over=C)
    return -sum(p, over=C) / 2.0

fn best(x: [b C]) -> [b] Index[C] = argmax(x, over=C)

fn loss(x: [b C], y: [b] Index[C]) -> [] = cross_entropy(x, y, over=C)
""",
    # group axes, dim arithmetic, dtypes, bools, tensordot, python and extern fns
    """dim H = 2
dim Dh = 3
dim L = 4

data Tok:
    ids: [L] i64
    mask: [L] bool

python fn make(n: int, path: str) -> Dataset[Tok] = "tok.make"

extern fn clean(x: [L] i64) -> [L] i64 = "tok.clean"

fn same(x: [n (H Dh)]) -> [n H*Dh] = x

fn pairs(x: [n H Dh], w: [Dh H 5]) -> [n H H 5] = x @ w

fn mask(x: [n] f64) -> [n] bool = x > 0.5 and not (x > 0.9)

fn any_big(x: [n m] f64) -> [n] bool = any(x >= 2.0, over=m)

fn cleaned(ids: [L] i64) -> [L] i64 = clean(ids) * 1

fn counts(batch: [b] Tok) -> [b] i64 = sum(batch.ids, over=L) + 1

fn hello(n: int, path: str):
    data = make(n, path)
    for batch in data |> batches(2):
        print("batch", counts(batch))
""",
    # the standard library: patterns, stacks of blocks, lookups, masks, modes, operations along an axis
    """dim C = 4
dim V = 7
dim D = 3
dim H = 2
dim Dh = 3
dim L = 2

model Block:
    param w: [D D] = normal(std=0.1)
    param b: [D] = zeros()

model Net:
    param emb: [V D] = normal(std=0.02)
    blocks: [L] Block
    param out: [D C] = normal(std=0.02)

extern fn clip01(x: [D], over: Axis[D]) -> [D] = "mod.clip01"

fn encode(m: Net, ids: [b n] Index[V], mode: Mode) -> [b n D]:
    h = embedding(m.emb, ids)
    for blk in m.blocks:
        h = dropout(relu(h @ blk.w + blk.b), 0.1, mode) + h
    return h

fn heads(x: [b n (H Dh)]) -> [b H n Dh] = rearrange(x, b n (h d) -> b h n d)

fn attend(q: [b h i d], k: [b h j d]) -> [b h i j]:
    s = einsum(q, k, b h i d, b h j d -> b h i j)
    s = masked_fill(s, causal(i, j), -1e9)
    return softmax(s, over=j)

fn pool(x: [b n D]) -> [b D] = reduce(x, b n d -> b d, max)

fn thirds(x: [b (3 D)]) -> [b D]:
    p, q, r = split(x, b (3 d) -> b d)
    return maximum(p, q) - minimum(q, r) + clamp(r, min=-1.0, max=1.0)

fn tiled(x: [b D]) -> [b C D] = repeat(x, b d -> b c d, c=C)

fn picks(x: [b C]) -> [b 2]:
    v, i = topk(x, 2, over=C)
    return gather(x, i, over=C) + sort(v, over=b) + cumsum(v, over=b)

fn scores(m: Net, ids: [b n] Index[V], y: [b] Index[C]) -> []:
    h = encode(m, ids, Eval())
    logits = pool(h) @ m.out
    return cross_entropy(logits, y, over=C) + mean(one_hot(y) * logits) + norm(h) * 0.0

fn masked(x: [b C], y: [b C]) -> [b C] = where(x > y, x, y * 2.0)
""",
    # sub-models, buffers, Sgd, checkpoints, devices with options
    """devices cpu[0 1]
    shard params

dim D = 4
dim H = 6
dim C = 3

data Ex:
    x: [D]
    y: [] Index[C]

model Layer:
    param w: [D H] = normal(mean=0, std=0.1)
    param b: [H] = zeros()

model Net:
    first: Layer
    param out: [H C] = uniform(low=-0.1, high=0.1)
    buffer steps: [] i64 = zeros()

fn logits(m: Net, x: [b D]) -> [b C] = tanh(x @ m.first.w + m.first.b) @ m.out

fn loss(m: Net, batch: [b] Ex) -> [] = cross_entropy(logits(m, batch.x), batch.y, over=C)

fn step(mut m: Net, mut opt: Sgd[Net], batch: [b] Ex) -> []:
    l, g = value_and_grad(loss, m, batch)
    update(mut m, mut opt, g)
    return l

fn fit(mut m: Net, mut opt: Sgd[Net], data: Dataset[Ex], log: Sink, path: str):
    load(path, mut m, mut opt)
    for batch in data |> shuffle(seed=1) |> batches(32):
        l = step(mut m, mut opt, batch)
        write(log, logs(loss=l, n=1))
    save(path, m, opt)
""",
]


def _doc_seeds() -> list[str]:
    path = ROOT / "docs" / "language.md"
    if not path.exists():
        return []
    return re.findall(r"```ss[^\n]*\n(.*?)```", path.read_text(), re.S)


def _readme_seed() -> list[str]:
    path = ROOT / "examples" / "readme" / "mlp.ss"
    return [path.read_text()] if path.exists() else []


SEEDS: list[str] = _readme_seed() + OWN_SEEDS + [c.example for c in CODES.values()] + _doc_seeds()


# ---- mutations and token soups ----------------------------------------------------------------

KEYWORDS = ["fn", "mut", "return", "for", "in", "and", "or", "not", "true", "false"]
ITEM_WORDS = ["devices", "dim", "data", "model", "param", "buffer", "extern", "python", "cpu", "cuda",
              "shard", "params", "split"]
TYPE_WORDS = ["f16", "bf16", "f32", "f64", "i32", "i64", "bool", "int", "float", "str", "Index",
              "Dataset", "AdamW", "Sgd", "Grad", "Sink", "Axis", "Logs", "Mode"]
FUNCS = ["relu", "exp", "sum", "mean", "max", "argmax", "softmax", "log_softmax", "cross_entropy",
         "matmul", "value_and_grad", "update", "shuffle", "batches", "print", "logs", "write", "save",
         "load", "normal", "zeros", "ones", "uniform", "rearrange", "einsum", "split", "reduce", "repeat",
         "where", "masked_fill", "causal", "gather", "scatter", "embedding", "one_hot", "topk", "sort",
         "cumsum", "clamp", "maximum", "minimum", "norm", "clip_norm", "dropout", "Train", "Eval"]
NAMES = ["b", "n", "m", "D", "C", "Hd", "H", "E", "x", "y", "w", "w1", "w2", "batch", "img", "label",
         "l", "g", "opt", "data", "log", "over", "seed", "std", "Mlp", "Digit", "Ex", "M", "loss",
         "forward", "train_step", "_x", "init", "spec", "size", "torch", "_rt", "class", "None",
         "lambda", "DIMS", "self", "blocks", "blk", "emb", "mode", "L", "V", "i", "j", "k"]
PUNCT = ["|>", "->", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", ",", ":", ".", "=", "+", "-",
         "*", "/", "@", "<", ">", "over=", "seed=", "std=", "mut", "()", "[]", "[b D]", "[]", "b n -> n b",
         "(h d)", "(3 D)", "min=", "max=", "c=C", "[L] Block"]
LITERALS = ["0", "1", "2", "3", "64", "784", "0.02", "1.5", "1e3", "-1", '"m.f"', '""', '"x"']
ODD = ["$", ";", "#", "\t", '"', "\\", "'", "?", "!", "{", "}", "~", "%", "&", "^", "`", "\r", "\x0c",
       "\x00", "\u2028", "\xa0", "é", "λ", "²", "٣", "ﬁ", "0x1", "1_000", "1.", ".5", "1e", "1e+",
       "9" * 30, "1e999", "_", "__", "...", "..", "\n", "\n    ", "\n\t"]
VOCAB = KEYWORDS + ITEM_WORDS + TYPE_WORDS + FUNCS + NAMES + PUNCT + LITERALS
TOKEN_RE = re.compile(r"\w+|\|>|->|\*\*|==|!=|<=|>=|\S")
CHARS = " \n\n    ()[],:.=+-*/@<>|#\"\tbnDCxmyfuw0123456789_"
INDENTS = ["\n", "\n", "\n    ", "\n        ", "\n  ", "\n            "]


def _lines(s: str) -> list[str]:
    return s.split("\n")


def mutate_once(r: Rand, src: str) -> str:
    op = r.choice(["delete_line", "duplicate_line", "swap_lines", "indent", "delete_chars", "insert_token",
                   "replace_token", "delete_token", "replace_name", "truncate", "insert_odd",
                   "join_lines", "split_line"])
    lines = _lines(src)
    k = r.randint(0, len(lines) - 1)
    if op == "delete_line":
        del lines[k]
    elif op == "duplicate_line":
        lines.insert(k, lines[k])
    elif op == "swap_lines":
        j = r.randint(0, len(lines) - 1)
        lines[k], lines[j] = lines[j], lines[k]
    elif op == "indent":
        body = lines[k].lstrip(" \t")
        lines[k] = r.choice(["", " ", "  ", "    ", "      ", "        ", "\t", "            "]) + body
    elif op == "join_lines" and k + 1 < len(lines):
        lines[k:k + 2] = [lines[k] + r.choice([" ", ""]) + lines[k + 1].lstrip()]
    elif op == "split_line" and lines[k]:
        c = r.randint(0, len(lines[k]))
        lines[k:k + 1] = [lines[k][:c], r.choice(["", "    ", "        "]) + lines[k][c:]]
    else:
        text = "\n".join(lines)
        if op == "delete_chars" and text:
            a = r.randint(0, len(text) - 1)
            return text[:a] + text[a + r.randint(1, 4):]
        if op in ("insert_token", "insert_odd"):
            a = r.randint(0, len(text))
            tok = r.choice(VOCAB if op == "insert_token" else ODD)
            pad = r.choice(["", " "])
            return text[:a] + pad + tok + pad + text[a:]
        if op == "truncate":
            return text[:r.randint(0, len(text))]
        spans = [m.span() for m in TOKEN_RE.finditer(text)]
        if not spans:
            return text
        a, b = r.choice(spans)
        if op == "replace_token":
            return text[:a] + r.choice(VOCAB) + text[b:]
        if op == "delete_token":
            return text[:a] + text[b:]
        if op == "replace_name":
            names = sorted({m.group() for m in re.finditer(r"(?<!\w)[A-Za-z_]\w*", text)})
            dims = sorted({n for shape in re.findall(r"\[([^\[\]]*)\]", text)
                           for n in re.findall(r"(?<!\w)[A-Za-z_]\w*", shape)})
            if dims and r.chance(0.5):  # a dim of a shape, by another
                names = dims
            if not names:
                return text
            old = r.choice(names)
            new = r.choice(names + ["b", "n", "D", "C", "Hd", "zz"])
            pattern = rf"(?<!\w){re.escape(old)}(?!\w)"
            hits = [m.span() for m in re.finditer(pattern, text)]
            if hits and r.chance(0.5):  # one occurrence
                a, b = r.choice(hits)
                return text[:a] + new + text[b:]
            return re.sub(pattern, lambda m: new, text)
        return text
    return "\n".join(lines)


def mutant(r: Rand) -> str:
    src = r.choice(SEEDS)
    for _ in range(r.randint(1, 4)):
        src = mutate_once(r, src)
    return src


def soup(r: Rand) -> str:
    out = []
    for _ in range(r.randint(0, 40)):
        what = r.randint(0, 9)
        if what == 0:
            out.append(r.choice(INDENTS))
        elif what == 1:
            out.append(r.choice(ODD) if r.chance(0.3) else r.choice(LITERALS))
        else:
            out.append(r.choice(VOCAB))
        out.append(r.choice([" ", " ", ""]))
    return "".join(out)


# ---- grammar-directed programs -----------------------------------------------------------------

FLOATS = ("f16", "bf16", "f32", "f64")


class TT(NamedTuple):
    """A tensor type in the generator: axis names (declared dims or the fn's generics)."""
    axes: tuple[str, ...]
    dtype: str = "f32"
    index: str | None = None

    def text(self) -> str:
        s = "[" + " ".join(self.axes) + "]"
        if self.index is not None:
            return f"{s} Index[{self.index}]"
        return s if self.dtype == "f32" else f"{s} {self.dtype}"

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS and self.index is None


class Ex(NamedTuple):
    text: str
    ty: TT
    simple: bool  # a name, a field or a call: needs no parentheses as an operand


class Param(NamedTuple):
    name: str
    kind: str  # tensor | model | batch | mode
    ty: TT | None
    mut: bool = False


class Sig(NamedTuple):
    name: str
    params: list[Param]
    ret: TT | None


def atom(e: Ex) -> str:
    return e.text if e.simple else f"({e.text})"


def plain(axis: str) -> bool:
    """A dim by name (`D`, `n`), not a group `(2 D)` or a literal `2`: what `over=` can name."""
    return axis.isidentifier()


def generic(axis: str) -> bool:
    return plain(axis) and axis[0].islower()


def unique_axes(t: TT) -> list[str]:
    return [d for d in t.axes if plain(d) and t.axes.count(d) == 1]


def _subsequence(small: tuple[str, ...], big: tuple[str, ...]) -> bool:
    it = iter(big)
    return all(any(a == b for b in it) for a in small)


class ProgramGen:
    """A random program grown from the typing rules, with a mistake now and then."""

    UNARY = ["relu", "exp", "tanh", "sigmoid", "gelu", "silu", "abs", "sqrt", "log"]
    REDUCE = ["sum", "mean", "max", "min", "logsumexp", "prod", "std", "var"]

    def __init__(self, r: Rand, mistakes: float = 0.2) -> None:
        self.r = r
        self.mistakes = mistakes
        self.out: list[str] = []
        self.sigs: list[Sig] = []
        self.dims: list[str] = []
        self.model: dict[str, TT] = {}  # model M's params
        self.data: dict[str, TT] = {}   # data Ex's fields (without the batch axis)
        self.stack: str | None = None   # M.blocks: [L] B, each with w: [S S], b: [S]; this is S
        self.n_fns = 0

    # -- items --

    def program(self) -> str:
        r = self.r
        if r.chance(0.15):
            self.out.append(r.choice(["devices cpu", "devices cuda", "devices cpu[0 1]",
                                      "devices cuda[0 1 2]\n    shard params", "devices cpu[0 1 2]\n    split b"]))
        self.dims = ["C"] + r.sample(["D", "E", "H", "K"], r.randint(1, 3))
        for d in self.dims:
            value = r.choice([2, 3, 4, 8, 16])
            if r.chance(self.mistakes / 10):
                self.out.append(r.choice([f"dim {d}", f"dim {d} = 0", f"dim {d} = {value}\ndim {d} = 2"]))
            else:
                self.out.append(f"dim {d} = {value}")
        xdim = r.choice(self.dims[1:])
        hdim = r.choice(self.dims)
        if r.chance(0.8):
            self.data = {"x": TT((xdim,)), "y": TT((), "i64", "C")}
            if r.chance(0.3):
                self.data["z"] = TT((xdim, "C"), r.choice(["f32", "f64", "bool"]))
            self.out.append("data Ex:\n" + "".join(f"    {k}: {t.text()}\n" for k, t in self.data.items()))
        if r.chance(0.7):
            self.model = {"w1": TT((xdim, hdim)), "w2": TT((hdim, "C"))}
            lines = [f"    param w1: [{xdim} {hdim}] = {self.init()}",
                     f"    param w2: [{hdim} C] = {self.init()}"]
            if r.chance(0.3):
                self.model["emb"] = TT(("C", hdim))
                lines.append(f"    param emb: [C {hdim}] = {self.init()}")
            if r.chance(0.3):
                self.stack = hdim
                self.out.append(f"dim L = {r.choice([1, 2, 3])}")
                self.out.append(f"model B:\n    param w: [{hdim} {hdim}] = {self.init()}\n"
                                f"    param b: [{hdim}] = {self.init()}\n")
                lines.append("    blocks: [L] B")
            if r.chance(0.5):
                self.model["b1"] = TT((hdim,))
                lines.append(f"    param b1: [{hdim}] = {self.init()}")
            if r.chance(0.2):
                self.model["steps"] = TT((), "i64")
                lines.append("    buffer steps: [] i64 = zeros()")
            if r.chance(self.mistakes / 5):
                lines.append(r.choice(["    param v: [n] = zeros()", "    param v: [C] i64 = zeros()",
                                       "    param v: [C] = gaussian(std=1)", "    param v: [C] = normal(sd=1)",
                                       "    w1: [C]", "    sub: M", "    param init: [C] = ones()"]))
            self.out.append("model M:\n" + "\n".join(lines) + "\n")
        if r.chance(0.2):
            self.out.append(f'extern fn ext(x: [{xdim}]) -> [{xdim}] = "mod.ext"')
            self.sigs.append(Sig("ext", [Param("x", "tensor", TT((xdim,)))], TT((xdim,))))
        for _ in range(r.randint(1, 4)):
            self.fn()
        if self.model and self.data and "y" in self.data and r.chance(0.5):
            self.training()
        return "\n".join(self.out) + "\n"

    def init(self) -> str:
        return self.r.choice(["normal(std=0.02)", "zeros()", "ones()", "uniform(low=-0.1, high=0.1)",
                              "normal(mean=0, std=1)", "normal(0.0, 0.5)"])

    # -- functions --

    def fn(self) -> None:
        r = self.r
        name = f"f{self.n_fns}"
        self.n_fns += 1
        generics = r.sample(["b", "n", "t"], r.randint(0, 2))
        axis_names = generics + self.dims
        params: list[Param] = []
        pool: list[Ex] = []
        uses_model = bool(self.model) and r.chance(0.3)
        uses_batch = bool(self.data) and r.chance(0.2)
        dtype = "f32" if uses_model or uses_batch or r.chance(0.85) else r.choice(["f64", "f16", "bf16"])
        if uses_model:
            params.append(Param("m", "model", None))
            pool += [Ex(f"m.{k}", t, True) for k, t in self.model.items()]
        if uses_batch:
            params.append(Param("batch", "batch", None))
            pool += [Ex(f"batch.{k}", TT(("bb",) + t.axes, t.dtype, t.index), True) for k, t in self.data.items()]
        for k in range(r.randint(0 if params else 1, 3)):
            rank = r.randint(0, 3)
            t = TT(tuple(self.param_axis(axis_names) for _ in range(rank)), dtype)
            pname = r.choice(["x", "y", "z", "w", "v"]) + str(k)
            params.append(Param(pname, "tensor", t))
            pool.append(Ex(pname, t, True))
        self.mode = None
        if r.chance(0.15):
            params.append(Param("mode", "mode", None))
            self.mode = "mode"
        body: list[str] = []
        made: list[Ex] = []
        block = r.chance(0.5)
        for step in range(r.randint(1, 6)):
            if block and r.chance(0.25):  # a statement that binds names: split, topk, a loop over blocks
                got = self.statement(pool, f"h{step}", uses_model)
                if got is not None:
                    stmt, new = got
                    body.append(stmt)
                    pool += new
                    made += new
                    continue
            e = self.step(pool)
            if e is None:
                continue
            if block and r.chance(0.4):
                var = f"h{step}"
                body.append(f"{var} = {e.text}")
                e = Ex(var, e.ty, True)
            pool.append(e)
            made.append(e)
        result = r.choice(made[-2:]) if made else r.choice(pool) if pool else Ex("0.0", TT(()), True)
        ret: TT | None = result.ty
        mistake = r.chance(self.mistakes)
        if mistake:
            result, ret, params, body = self.mistake(result, ret, params, body, pool, axis_names)
        sig_params = ", ".join(self.param_text(p) for p in params)
        head = f"fn {name}({sig_params})" + (f" -> {ret.text()}" if ret is not None else "")
        if block or body or ret is None:
            tail = f"return {result.text}" if ret is not None else f"print({result.text})"
            self.out.append(head + ":\n" + "".join(f"    {s}\n" for s in body + [tail]))
        else:
            self.out.append(f"{head} = {result.text}\n")
        if not mistake and ret is not None and all(p.kind != "batch" for p in params):
            self.sigs.append(Sig(name, params, ret))

    def param_axis(self, axis_names: list[str]) -> str:
        r = self.r
        if r.chance(0.1):  # a group axis, which `split` and `rearrange` take apart
            return f"({r.choice(['2', '3', r.choice(axis_names)])} {r.choice(axis_names)})"
        return r.choice(axis_names)

    def param_text(self, p: Param) -> str:
        mut = "mut " if p.mut else ""
        if p.kind == "mode":
            return f"{p.name}: Mode"
        if p.kind == "model":
            return f"{mut}{p.name}: M"
        if p.kind == "batch":
            return f"{mut}{p.name}: [bb] Ex"
        assert p.ty is not None
        return f"{mut}{p.name}: {p.ty.text()}"

    def step(self, pool: list[Ex]) -> Ex | None:
        r = self.r
        ops: list[Callable[[list[Ex]], Ex | None]] = [
            self.unary, self.binary, self.binary, self.reduce, self.softmax, self.matmul, self.matmul,
            self.cross_entropy, self.call, self.call, self.compare, self.negate, self.literal_op,
            self.rearrange, self.rearrange, self.reduce_pattern, self.repeat, self.einsum, self.einsum,
            self.where, self.pairwise, self.clamp, self.along, self.norm, self.one_hot, self.embedding,
            self.dropout, self.masked_causal]
        for _ in range(4):
            e = r.choice(ops)(pool)
            if e is not None and len(e.text) < 400:
                return e
        return None

    def floats(self, pool: list[Ex]) -> list[Ex]:
        return [e for e in pool if e.ty.is_float]

    def unary(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e, f = self.r.choice(fs), self.r.choice(self.UNARY)
        if self.r.chance(0.2):
            return Ex(f"{atom(e)} |> {f}", e.ty, False)
        return Ex(f"{f}({e.text})", e.ty, True)

    def negate(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e = self.r.choice(fs)
        return Ex(f"-{atom(e)}", e.ty, False)

    def literal_op(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e = self.r.choice(fs)
        op, lit = self.r.choice(["+", "-", "*", "/", "**"]), self.r.choice(["2", "0.5", "1.0", "3"])
        return Ex(f"{atom(e)} {op} {lit}" if self.r.chance(0.7) else f"{lit} {op} {atom(e)}", e.ty, False)

    def binary(self, pool):
        r = self.r
        fs = self.floats(pool)
        if not fs:
            return None
        a = r.choice(fs)
        partners = [e for e in fs if e.ty.dtype == a.ty.dtype and (e.ty.axes == a.ty.axes or (
            len(e.ty.axes) < len(a.ty.axes) and _subsequence(e.ty.axes, a.ty.axes)))]
        b = r.choice(partners)
        left, right = (a, b) if r.chance(0.5) else (b, a)
        op = r.choice(["+", "-", "*", "/"])
        return Ex(f"{atom(left)} {op} {atom(right)}", a.ty, False)

    def compare(self, pool):
        r = self.r
        fs = self.floats(pool)
        if not fs:
            return None
        a = r.choice(fs)
        same = [e for e in fs if e.ty == a.ty]
        other = atom(r.choice(same)) if r.chance(0.5) else r.choice(["0.0", "1", "0.5"])
        cond = Ex(f"{atom(a)} {r.choice(['>', '<', '>=', '<=', '==', '!='])} {other}", TT(a.ty.axes, "bool"), False)
        if r.chance(0.3):
            cond = Ex(f"not ({cond.text})", cond.ty, False)
        if r.chance(0.3):
            cond = Ex(f"({cond.text}) {r.choice(['and', 'or'])} ({cond.text})", cond.ty, False)
        unique = unique_axes(a.ty)
        f = r.choice(["any", "all"])
        if unique and r.chance(0.6):
            d = r.choice(unique)
            return Ex(f"{f}({cond.text}, over={d})", TT(tuple(x for x in a.ty.axes if x != d), "bool"), True)
        return Ex(f"{f}({cond.text})", TT((), "bool"), True) if r.chance(0.7) else cond

    def reduce(self, pool):
        r = self.r
        fs = [e for e in self.floats(pool)]
        if not fs:
            return None
        e = r.choice(fs)
        unique = unique_axes(e.ty)
        if unique and r.chance(0.8):
            d = r.choice(unique)
            rest = tuple(x for x in e.ty.axes if x != d)
            if r.chance(0.2):
                f = r.choice(["argmax", "argmin"])
                return Ex(f"{f}({e.text}, over={d})", TT(rest, "i64", d), True)
            f = r.choice(self.REDUCE)
            form = r.randint(0, 2)
            if form == 0:
                return Ex(f"{f}({e.text}, over={d})", TT(rest, e.ty.dtype), True)
            if form == 1:
                return Ex(f"{atom(e)} |> {f}(over={d})", TT(rest, e.ty.dtype), False)
            return Ex(f"{f}(x={e.text}, over={d})", TT(rest, e.ty.dtype), True)
        return Ex(f"{r.choice(self.REDUCE)}({e.text})", TT((), e.ty.dtype), True)

    def softmax(self, pool):
        r = self.r
        fs = [e for e in self.floats(pool) if unique_axes(e.ty)]
        if not fs:
            return None
        e = r.choice(fs)
        d = r.choice(unique_axes(e.ty))
        f = r.choice(["softmax", "log_softmax"])
        return Ex(f"{f}({e.text}, over={d})", e.ty, True)

    def matmul(self, pool):
        r = self.r
        fs = [e for e in self.floats(pool) if e.ty.axes]
        pairs = [(a, b) for a in fs for b in fs if a.ty.axes[-1] == b.ty.axes[0] and a.ty.dtype == b.ty.dtype]
        if not pairs:
            return None
        a, b = r.choice(pairs)
        t = TT(a.ty.axes[:-1] + b.ty.axes[1:], a.ty.dtype)
        if r.chance(0.2):
            return Ex(f"matmul({a.text}, {b.text})", t, True)
        return Ex(f"{atom(a)} @ {atom(b)}", t, False)

    def cross_entropy(self, pool):
        r = self.r
        options = []
        for lab in pool:
            if lab.ty.index is None:
                continue
            for lg in self.floats(pool):
                d = lab.ty.index
                if d in unique_axes(lg.ty) and tuple(x for x in lg.ty.axes if x != d) == lab.ty.axes:
                    options.append((lg, lab, d))
        if not options:
            return None
        lg, lab, d = r.choice(options)
        return Ex(f"cross_entropy({lg.text}, {lab.text}, over={d})", TT((), lg.ty.dtype), True)

    # -- the standard library --

    @staticmethod
    def names(n: int, start: int = 0) -> list[str]:
        return [f"p{k}" for k in range(start, start + n)]

    def rearrange(self, pool):
        """A permutation, a merge of two neighbours into a group, or a group taken apart."""
        r = self.r
        es = [e for e in pool if e.ty.axes and e.ty.index is None]
        if not es:
            return None
        e = r.choice(es)
        axes = list(e.ty.axes)
        names = self.names(len(axes))
        groups = [k for k, a in enumerate(axes) if a.startswith("(") and a[1:-1].split()[0].isidentifier()]
        if groups and r.chance(0.4):  # (p q) -> p q, when both parts are dims
            k = r.choice(groups)
            parts = axes[k][1:-1].split()
            lhs = names[:k] + [f"({names[k]} q9)"] + names[k + 1:]
            rhs = names[:k] + [names[k], "q9"] + names[k + 1:]
            out = axes[:k] + parts + axes[k + 1:]
        else:
            order = list(range(len(axes)))
            for k in range(len(order) - 1, 0, -1):
                j = r.randint(0, k)
                order[k], order[j] = order[j], order[k]
            lhs, rhs, out = names, [names[k] for k in order], [axes[k] for k in order]
            if len(out) >= 2 and r.chance(0.4):
                k = r.randint(0, len(out) - 2)
                if plain(out[k]) and plain(out[k + 1]):
                    rhs = rhs[:k] + [f"({rhs[k]} {rhs[k + 1]})"] + rhs[k + 2:]
                    out = out[:k] + [f"({out[k]} {out[k + 1]})"] + out[k + 2:]
        return Ex(f"rearrange({e.text}, {' '.join(lhs)} -> {' '.join(rhs)})", TT(tuple(out), e.ty.dtype), True)

    def reduce_pattern(self, pool):
        r = self.r
        es = [e for e in self.floats(pool) if e.ty.axes]
        if not es:
            return None
        e = r.choice(es)
        names = self.names(len(e.ty.axes))
        keep = [k for k in range(len(names)) if r.chance(0.6)]
        op = r.choice(["sum", "mean", "max", "min", "prod"])
        out = TT(tuple(e.ty.axes[k] for k in keep), e.ty.dtype)
        rhs = " ".join(names[k] for k in keep)
        form = f", op={op}" if r.chance(0.3) else f", {op}"
        return Ex(f"reduce({e.text}, {' '.join(names)} -> {rhs}{form})", out, True)

    def repeat(self, pool):
        r = self.r
        es = [e for e in pool if e.ty.index is None]
        if not es:
            return None
        e = r.choice(es)
        names = self.names(len(e.ty.axes))
        new = r.choice(self.dims)
        k = r.randint(0, len(names))
        rhs = names[:k] + ["z9"] + names[k:]
        out = e.ty.axes[:k] + (new,) + e.ty.axes[k:]
        size = new if r.chance(0.7) else str(r.choice([2, 3]))
        if size != new:
            out = e.ty.axes[:k] + (size,) + e.ty.axes[k:]
        return Ex(f"repeat({e.text}, {' '.join(names)} -> {' '.join(rhs)}, z9={size})", TT(out, e.ty.dtype), True)

    def einsum(self, pool):
        """Two operands, one letter per dim, some dims contracted."""
        r = self.r
        fs = [e for e in self.floats(pool) if e.ty.axes and all(plain(a) for a in e.ty.axes)]
        if not fs:
            return None
        a = r.choice(fs)
        partners = [e for e in fs if e.ty.dtype == a.ty.dtype]
        b = r.choice(partners)
        letters: dict[str, str] = {}
        for d in a.ty.axes + b.ty.axes:
            letters.setdefault(d, f"e{len(letters)}")
        dims = list(letters)
        out = [d for d in dims if r.chance(0.6)]
        for k in range(len(out) - 1, 0, -1):
            j = r.randint(0, k)
            out[k], out[j] = out[j], out[k]
        pat = f"{' '.join(letters[d] for d in a.ty.axes)}, {' '.join(letters[d] for d in b.ty.axes)} -> " \
              f"{' '.join(letters[d] for d in out)}"
        return Ex(f"einsum({a.text}, {b.text}, {pat})", TT(tuple(out), a.ty.dtype), True)

    def where(self, pool):
        r = self.r
        fs = self.floats(pool)
        if not fs:
            return None
        a = r.choice(fs)
        smaller = [e for e in fs if e.ty.dtype == a.ty.dtype and _subsequence(e.ty.axes, a.ty.axes)]
        c = r.choice(smaller)
        same = [e for e in fs if e.ty == a.ty]
        b = atom(r.choice(same)) if r.chance(0.6) else r.choice(["0.0", "1.0"])
        return Ex(f"where({atom(c)} > 0.5, {a.text}, {b})", a.ty, True)

    def pairwise(self, pool):
        r = self.r
        fs = self.floats(pool)
        if not fs:
            return None
        a = r.choice(fs)
        partners = [e for e in fs if e.ty.dtype == a.ty.dtype and (e.ty.axes == a.ty.axes or (
            len(e.ty.axes) < len(a.ty.axes) and _subsequence(e.ty.axes, a.ty.axes)))]
        b = r.choice(partners)
        left, right = (a, b) if r.chance(0.5) else (b, a)
        return Ex(f"{r.choice(['maximum', 'minimum'])}({left.text}, {right.text})", a.ty, True)

    def clamp(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e = self.r.choice(fs)
        bounds = self.r.choice(["min=0.0", "max=1.0", "min=-1.0, max=1.0", "max=2, min=-2"])
        return Ex(f"clamp({e.text}, {bounds})", e.ty, True)

    def along(self, pool):
        es = [e for e in pool if e.ty.index is None and unique_axes(e.ty)]
        if not es:
            return None
        e = self.r.choice(es)
        d = self.r.choice(unique_axes(e.ty))
        return Ex(f"{self.r.choice(['cumsum', 'sort'])}({e.text}, over={d})", e.ty, True)

    def norm(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e = self.r.choice(fs)
        unique = unique_axes(e.ty)
        if unique and self.r.chance(0.6):
            d = self.r.choice(unique)
            return Ex(f"norm({e.text}, over={d})", TT(tuple(a for a in e.ty.axes if a != d), e.ty.dtype), True)
        return Ex(f"norm({e.text})", TT((), e.ty.dtype), True)

    def one_hot(self, pool):
        labels = [e for e in pool if e.ty.index is not None and e.ty.index in self.dims]
        if not labels:
            return None
        e = self.r.choice(labels)
        return Ex(f"one_hot({e.text})", TT(e.ty.axes + (e.ty.index,)), True)

    def embedding(self, pool):
        tables = [e for e in self.floats(pool) if len(e.ty.axes) == 2 and plain(e.ty.axes[0])]
        pairs = [(t, i) for t in tables for i in pool if i.ty.index == t.ty.axes[0]]
        if not pairs:
            return None
        t, i = self.r.choice(pairs)
        return Ex(f"embedding({t.text}, {i.text})", TT(i.ty.axes + t.ty.axes[1:], t.ty.dtype), True)

    def dropout(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e = self.r.choice(fs)
        mode = self.mode or self.r.choice(["Eval()", "Train(seed=3)"])
        return Ex(f"dropout({e.text}, {self.r.choice(['0.1', '0.5', '0'])}, {mode})", e.ty, True)

    def masked_causal(self, pool):
        fs = [e for e in self.floats(pool) if len(e.ty.axes) >= 2 and plain(e.ty.axes[-1]) and plain(e.ty.axes[-2])]
        if not fs:
            return None
        e = self.r.choice(fs)
        i, j = e.ty.axes[-2:]
        return Ex(f"masked_fill({e.text}, causal({i}, {j}), -1e9)", e.ty, True)

    def statement(self, pool: list[Ex], var: str, uses_model: bool) -> tuple[str, list[Ex]] | None:
        """A statement that binds several names or loops: split, topk (and gather), blocks."""
        r = self.r
        kind = r.randint(0, 2)
        if kind == 0:  # split a group axis with a literal count
            es = [e for e in pool if any(a.startswith("(") and a[1:-1].split()[0].isdigit() for a in e.ty.axes)]
            if not es:
                return None
            e = r.choice(es)
            k = next(i for i, a in enumerate(e.ty.axes) if a.startswith("(") and a[1:-1].split()[0].isdigit())
            count, part = e.ty.axes[k][1:-1].split()
            names = self.names(len(e.ty.axes))
            lhs = names[:k] + [f"({count} {names[k]})"] + names[k + 1:]
            out = TT(e.ty.axes[:k] + (part,) + e.ty.axes[k + 1:], e.ty.dtype, e.ty.index)
            targets = [f"{var}_{n}" for n in range(int(count))]
            stmt = f"{', '.join(targets)} = split({e.text}, {' '.join(lhs)} -> {' '.join(names)})"
            return stmt, [Ex(t, out, True) for t in targets]
        if kind == 1:  # topk, then gather with its indices
            es = [e for e in pool if e.ty.index is None and e.ty.dtype != "bool" and unique_axes(e.ty)]
            if not es:
                return None
            e = r.choice(es)
            d = r.choice(unique_axes(e.ty))
            k = e.ty.axes.index(d)
            axes = e.ty.axes[:k] + ("2",) + e.ty.axes[k + 1:]
            values, index = TT(axes, e.ty.dtype), TT(axes, "i64", d)
            stmt = f"{var}_v, {var}_i = topk({e.text}, 2, over={d})"
            picked = Ex(f"gather({e.text}, {var}_i, over={d})", values, True)
            return stmt, [Ex(f"{var}_v", values, True), Ex(f"{var}_i", index, True), picked]
        if self.stack is None or not uses_model:  # a loop over the model's blocks
            return None
        s = self.stack
        es = [e for e in self.floats(pool) if e.ty.axes and e.ty.axes[-1] == s and e.ty.dtype == "f32"]
        if not es:
            return None
        e = r.choice(es)
        stmt = (f"{var} = {e.text}\n    for blk in m.blocks:\n"
                f"        {var} = {r.choice(['relu', 'tanh'])}({var} @ blk.w + blk.b) + {var}")
        return stmt, [Ex(var, e.ty, True)]

    def call(self, pool):
        r = self.r
        if not self.sigs:
            return None
        sig = r.choice(self.sigs)
        binding: dict[str, str] = {}
        args: list[str] = []
        keyword = False
        for p in sig.params:
            if p.kind == "model":
                if not self.model or not any(e.text.startswith("m.") for e in pool):
                    return None
                args.append("m=m" if keyword else "m")
                continue
            if p.kind == "mode":
                mode = self.mode or r.choice(["Eval()", "Train(seed=1)"])
                args.append(f"{p.name}={mode}" if keyword else mode)
                continue
            assert p.ty is not None
            fits = [e for e in pool if self.fits(p.ty, e.ty, binding)]
            if not fits:
                return None
            e = r.choice(fits)
            for pa, ea in zip(p.ty.axes, e.ty.axes):
                if generic(pa):
                    binding.setdefault(pa, ea)
            keyword = keyword or r.chance(0.15)  # keywords, once begun, to the end
            args.append(f"{p.name}={e.text}" if keyword else e.text)
        assert sig.ret is not None
        ret = TT(tuple(binding.get(a, a) for a in sig.ret.axes), sig.ret.dtype, sig.ret.index)
        if len(args) >= 1 and not args[0].startswith(sig.params[0].name + "=") and r.chance(0.15) \
                and sig.params[0].kind == "tensor":
            first = next(e for e in pool if e.text == args[0])
            return Ex(f"{atom(first)} |> {sig.name}({', '.join(args[1:])})", ret, False)
        return Ex(f"{sig.name}({', '.join(args)})", ret, True)

    @staticmethod
    def fits(p: TT, a: TT, binding: dict[str, str]) -> bool:
        if len(p.axes) != len(a.axes) or p.dtype != a.dtype or (p.index is None) != (a.index is None):
            return False
        local = dict(binding)
        for pa, aa in zip(p.axes, a.axes):
            if generic(pa):
                if local.setdefault(pa, aa) != aa:
                    return False
            elif pa != aa:
                return False
        return p.index is None or local.get(p.index, p.index) == a.index

    # -- deliberate mistakes, so that programs fail in the checker too --

    def mistake(self, result: Ex, ret: TT | None, params: list[Param], body: list[str], pool: list[Ex],
                axis_names: list[str]):
        r = self.r
        kind = r.randint(0, 14)
        fs = self.floats(pool) or [result]
        a, b = r.choice(fs), r.choice(fs)
        if kind == 0 and ret is not None:  # a result type that differs
            axes = list(ret.axes)
            if axes and r.chance(0.5):
                axes.pop(r.randint(0, len(axes) - 1))
            else:
                axes.insert(r.randint(0, len(axes)), r.choice(axis_names))
            ret = TT(tuple(axes), r.choice([ret.dtype, "f64", "i64", "bool"]))
        elif kind == 1:  # operands that don't broadcast
            result = Ex(f"{atom(a)} + {atom(b)}", a.ty, False)
        elif kind == 2:  # over= a dim the operand lacks
            result = Ex(f"sum({a.text}, over={r.choice(axis_names + ['Q', 'b'])})", ret or a.ty, True)
        elif kind == 3:  # @ of mismatched axes
            result = Ex(f"{atom(a)} @ {atom(b)}", a.ty, False)
        elif kind == 4:  # unknown names
            result = Ex(r.choice(["zz", "frob(x0)", "relux(x0)", f"{atom(a)} * scale"]), a.ty, False)
        elif kind == 5:  # a dim used as a value
            result = Ex(f"{atom(a)} * {r.choice(self.dims)}", a.ty, False)
        elif kind == 6:  # indexing
            result = Ex(f"{atom(a)}[0]", a.ty, True)
        elif kind == 7 and self.sigs:  # a call with the wrong number of arguments
            sig = r.choice(self.sigs)
            result = Ex(f"{sig.name}({', '.join(e.text for e in r.sample(pool, r.randint(0, 3)))})", a.ty, True)
        elif kind == 8 and self.sigs:  # a call with a wrong keyword or mut
            sig = r.choice(self.sigs)
            result = Ex(f"{sig.name}(mut {a.text}, nope={b.text})", a.ty, True)
        elif kind == 9:  # a generic dim in the result only
            ret = TT((ret.axes if ret else ()) + ("q",), ret.dtype if ret else "f32")
        elif kind == 10:  # a parameter listed twice / a mut tensor parameter changed by update
            if params:
                params = params + [params[0]]
        elif kind == 11:  # a builtin with wrong arguments
            result = Ex(r.choice([f"softmax({a.text})", f"cross_entropy({a.text}, {b.text}, over=C)",
                                  f"relu({a.text}, {b.text})", f"mean(over=C)", f"argmax({a.text})",
                                  f"value_and_grad({a.text})", f"batches({a.text}, 0)",
                                  f"update({a.text}, {b.text}, {a.text})"]), a.ty, True)
        elif kind == 12:  # dtype mix
            result = Ex(f"{atom(a)} + {atom(b)}", a.ty, False)
            params = [p._replace(ty=p.ty._replace(dtype=r.choice(["f64", "i32", "bool"])))
                      if p.kind == "tensor" and p.ty is not None and r.chance(0.5) else p for p in params]
        elif kind == 14:  # a pattern that doesn't fit
            n = len(a.ty.axes)
            names = " ".join(self.names(n))
            result = Ex(r.choice([
                f"rearrange({a.text}, {names} -> {names} p{n})", f"rearrange({a.text}, {names} p{n} -> {names})",
                f"rearrange({a.text}, {names} -> {' '.join(self.names(max(n - 1, 0)))})",
                f"reduce({a.text}, {names} -> {names})", f"reduce({a.text}, {names} -> , avg)",
                f"split({a.text}, {names} -> {names})", f"repeat({a.text}, {names} -> {names} z9)",
                f"einsum({a.text}, {b.text}, {names} -> {names})", f"rearrange({a.text}, ({names}) -> {names})",
                f"rearrange({a.text}, {names} -> ({names}) 2)", f"einsum({a.text}, ({names}) -> {names})",
                f"rearrange({a.text})", f"rearrange({a.text}, {b.text}, {names} -> {names})",
                f"repeat({a.text}, {names} -> {names} z9, z9=0)", f"repeat({a.text}, {names} -> z9 {names}, z9=n)"]),
                a.ty, True)
        else:  # no return / an unused broken statement
            if ret is not None and r.chance(0.5):
                body = body + [f"q = {atom(a)} @ {atom(b)} @ {atom(a)}"]
            else:
                body = body + [f"{a.text}"]
                result = Ex(f"{result.text}, {a.text}", result.ty, False) if r.chance(0.3) else result
        return result, ret, params, body

    # -- the README's training functions, perturbed --

    def training(self) -> None:
        r = self.r
        opt = r.choice(["AdamW", "Sgd"])
        act = r.choice(["relu", "tanh", "gelu"])
        bias = " + m.b1" if "b1" in self.model else ""
        logits = f"{act}(batch.x @ m.w1{bias}) @ m.w2"
        mistake = r.chance(self.mistakes)
        bad = r.randint(0, 9) if mistake else -1
        over = "C" if bad != 0 else r.choice(self.dims[1:])
        self.out.append(f"fn loss(m: M, batch: [b] Ex) -> [] = cross_entropy({logits}, batch.y, over={over})\n")
        mut_m = "" if bad == 1 else "mut "
        call_mut = "" if bad == 2 else "mut "
        opt2 = ("Sgd" if opt == "AdamW" else "AdamW") if bad == 3 else opt
        loss_fn = "forward" if bad == 4 else "loss"
        self.out.append(f"fn train_step({mut_m}m: M, mut opt: {opt}[M], batch: [b] Ex) -> []:\n"
                        f"    l, g = value_and_grad({loss_fn}, m, batch)\n"
                        f"    update({call_mut}m, mut opt, g)\n"
                        f"    return {'g' if bad == 5 else 'l'}\n")
        loop = "data |> shuffle(seed=0) |> batches(8)" if bad != 6 else "data |> shuffle(seed=0)"
        size = "0" if bad == 7 else r.choice(["8", "64", "1"])
        loop = loop.replace("batches(8)", f"batches({size})")
        extra = ""
        if bad == 8:
            extra = "        l2, g2 = value_and_grad(loss, m, batch)\n"
        if r.chance(0.5):
            extra += f"        print(\"step\", l)\n"
        save = r.choice(["", "    save(\"ck.safetensors\", m, opt)\n", "    save(\"ck.safetensors\", m)\n"])
        if bad == 9:
            save = "    load(\"ck.safetensors\", m, opt)\n"
        self.out.append(f"fn fit(mut m: M, mut opt: {opt2}[M], data: Dataset[Ex], log: Sink):\n"
                        f"    for batch in {loop}:\n"
                        f"        l = train_step(mut m, mut opt, batch)\n"
                        f"        write(log, logs(loss=l))\n{extra}{save}")


def deep_program(r: Rand) -> str:
    """Deep nesting and long chains: parentheses, unary minus, `**`, `+`, calls, pipes, blocks."""
    n = r.choice([1, 2, 10, 50, 100, 200, 300, 500])
    form = r.randint(0, 8)
    if form == 0:
        body = "(" * n + "x" + ")" * n
    elif form == 1:
        body = "-" * n + "x"
    elif form == 2:
        body = " ** ".join(["x"] * n)
    elif form == 3:
        body = " + ".join(["x"] * n)
    elif form == 4:
        body = "relu(" * n + "x" + ")" * n
    elif form == 5:
        body = "x" + " |> relu" * n
    elif form == 6:
        body = "not " * n + "(x > 0.0)"
    elif form == 7:  # nested blocks
        lines = ["fn f(d: Dataset[Ex]):"]
        for k in range(1, min(n, 90) + 1):
            lines.append("    " * k + f"for b{k} in d |> batches(2):")
        lines.append("    " * (min(n, 90) + 1) + "print(1)")
        return "dim D = 2\ndata Ex:\n    x: [D]\n" + "\n".join(lines) + "\n"
    else:  # a long dim expression
        return "fn f(x: [" + "*".join(["n"] * n) + "]) -> [" + "*".join(["n"] * n) + "] = x\n"
    return f"fn f(x: [n]) -> [n] = {body}\n"


def grammar_program(r: Rand) -> str:
    return ProgramGen(r).program()


def grammar_mutant(r: Rand) -> str:
    """A grammar program with one text mutation: near-valid programs the seeds don't cover."""
    return mutate_once(r, ProgramGen(r, mistakes=0.0).program())


KINDS: dict[str, Callable[[Rand], str]] = {
    "mutant": mutant, "soup": soup, "grammar": grammar_program, "grammar_mutant": grammar_mutant,
    "deep": deep_program}

# Programs aimed at corners the random ones rarely reach: non-ASCII digits and letters, names the
# generated Python mangles, dims without a size, types in odd places, literals out of range,
# and the end of the file in the middle of a construct.
TRICKY = [
    "fn f(x: [n]) -> [n] = x * \u00b2\n",
    "fn f(x: [n]) -> [n] = x * 1.\u00b2\n",
    "dim D = \u00b2\n",
    "devices cpu[\u00b9]\n",
    "fn f(x: [\u2460]) -> [\u2460] = x\n",
    "fn f(x: [n]) -> [n] = x * \u0663\n",
    "fn f(x\u00b2: [n]) -> [n] = x\u00b2\n",
    "fn \ufb01x(x: [n]) -> [n] = x\nfn fix(x: [n]) -> [n] = x * 2\n",
    "fn f(_x: [n], ss__x: [n]) -> [n] = _x + ss__x\n",
    "fn f(class: [n], ss_class: [n]) -> [n] = class + ss_class\n",
    "fn _g(x: [n]) -> [n] = x\nfn ss__g(x: [n]) -> [n] = x\n",
    "fn DIMS(x: [n]) -> [n] = x\n",
    "fn SS_LINES(x: [n]) -> [n] = x\n",
    "dim D = 2\ndata E:\n    x: [D]\n\nfn E_spec(x: [n]) -> [n] = x\n",
    "dim D = 2\ndata E:\n    x: [D]\n\nfn f(d: Dataset[E], E_spec: int):\n    for b in d |> batches(2):\n"
    "        print(b.x)\n",
    "dim D = 2\ndata E:\n    class: [D]\n\nfn f(getattr: [n], b: [k] E) -> [k D] = b.class\n",
    "python fn f(PYTHON_RESULTS: int) -> int = \"m.f\"\n",
    "fn f(x: [n]) -> [n] = x * 1e999\n",
    "fn f(x: [n]) -> [n] = x * 1e400 - 1e400\n",
    "fn f(y: [n] Index[[D]]) -> [n] = y\n",
    "fn f(y: [n] Index[[]]) -> [n] = y\n",
    "dim C = 3\nfn f(y: Index[Index[C]]) -> [] = y\n",
    "dim D = 3\nfn f(y: Dataset[[D]], z: AdamW[[D]]) -> [] = 1.0\n",
    "dim D\nmodel M:\n    param w: [D] = zeros()\n",
    "dim V\nmodel M:\n    param w: [V*2] = zeros()\n",
    "dim V\ndata T:\n    y: [] Index[V]\n",
    "dim D\ndim E\nfn g(x: [D]) -> [D] = x\nfn f(y: [E]) -> [D] = g(y)\n",
    "dim D\ndim E\nfn f(x: [D], y: [E]) -> [] = x @ y\n",
    "dim D = 3\ndim C = 2\nmodel M:\n    param w: [D/C] = zeros()\n",
    "dim D = 3\nmodel M:\n    param w: [D/(D-D)] = zeros()\n",
    "dim D = 3\nfn f(x: [n/(D-D)]) -> [n/(D-D)] = x\n",
    "model A:",
    "fn f(x: [n]) -> [n]:",
    "data E:\n    x:",
    "fn f(x: [n]) -> [n] =",
    "fn f(x: [n]) -> [n] = sum(x,",
    "fn f(x: [n]) -> [n] = einsum(x, x, a, a -> a)\n",
    "fn f(x: [n]) -> [n] = g(-> a)\n",
    "fn f(x: [n]) -> [n] = rearrange(x, n -> (n n) 2)\n",
    "fn f(x: [(n)*2]) -> [2*n] = x\n",
    "fn f(x: [(n) (m)]) -> [n m] = x\n",
    "fn f(x: [n]) -> [n]:\n    return x\n  return x\n",
    "fn f(x: [n]) -> [n]:\r\n    return x\r\n",
    "fn f(x: [n]) -> [n]:\n\x0c    return x\n",
    "fn f(x: [n]) -> [n] = x # \u2028 comment\n",
    "devices cpu[0 1]\n    split\n",
    "devices cpu[]\n",
    "fn f():\n    return\n",
    "fn f() -> []:\n    for b in 1:\n        return 1.0\n",
    "fn f(x: [n]) -> (x):\n    return x\n",
    "fn f(x: [n]) -> [n] = (x, x)\n",
    "fn f(x: [n]):\n    print((x, x), ())\n",
    'python fn e(x: []) -> [] = "\\N"\n',
    'python fn e(x: []) -> [] = "mod.\\x"\n',
    'python fn e(x: []) -> [] = "\x00"\n',
    "fn f(x: [n]) -> [n] = " + " + ".join(["x"] * 210) + "\n",
    "fn f(c: [n], x: [n k]) -> [n k] = where(c > 0.5, x, x)\n",
    "fn f(c: [n], x: [n k]) -> [n k] = masked_fill(x, c > 0.5, 0.0)\n",
    "fn f(x: [" + " ".join(f"a{k}" for k in range(53)) + "]) -> [] = einsum(x, "
    + " ".join(f"p{k}" for k in range(53)) + " -> )\n",
    "fn f(x: [n]) -> [n] = rearrange(x, (\u00b2 a) -> a)\n",
    "fn f(x: [], log: Sink):\n    write(log, logs(class=x))\n",
    "fn f(x: []):\n    print(logs(x=x, x=x))\n",
]


# ---- the tests ---------------------------------------------------------------------------------

try:
    from hypothesis import HealthCheck, given, note, settings
    from hypothesis import strategies as st
except ImportError:  # the helpers below work without hypothesis; the tests need it
    if "pytest" in sys.modules:
        import pytest
        pytest.skip("hypothesis is not installed (pip install -e .[test])", allow_module_level=True)
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


# ---- helpers: the meter and the bug hunter (not tests) ------------------------------------------

def outcome(source: str) -> str:
    try:
        return compile_program(source)
    except Exception:  # noqa: BLE001 - a bug, counted by the meter, reported by the tests
        return "internal"


def bug_key(exc: BaseException) -> str:
    """Where an internal error comes from: the innermost frame in the compiler (or the assertion)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "shapescript" in f.filename and "tests" not in f.filename]
    if ours:  # the innermost two frames in the compiler
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno} ({f.name})" for f in reversed(ours[-2:]))
        return f"{type(exc).__name__} at {where}"
    f = frames[-1]
    detail = ""
    if isinstance(exc, AssertionError):  # one of our checks: its kind, and the code it is about
        text = str(exc)
        code = re.match(r"E\d{4}", text)
        detail = " " + (code.group() + " " if code else "") + re.sub(r"`[^`]*`|'[^']*'|\[[^]]*\]|\d+", "_",
                                                                       text.split("\n")[0])[-60:]
    elif isinstance(exc, CompilerRecursion):
        detail = " " + str(exc)
    elif isinstance(exc, SyntaxError):
        detail = " " + re.sub(r"'[^']*'|\(.*\)", "_", str(exc))[:60]
    return f"{type(exc).__name__} at {Path(f.filename).name}:{f.lineno} ({f.name}){detail}"


def _fails_same(src: str, key: str) -> bool:
    try:
        compile_program(src)
    except Exception as e:  # noqa: BLE001
        return bug_key(e) == key
    return False


def minimize(src: str, key: str) -> str:
    """Delta debugging by lines, then tokens, then characters, keeping the same failure."""
    def pass_over(units: list[str], joiner: str) -> list[str]:
        n = max(1, len(units) // 2)
        while n >= 1:
            k, changed = 0, False
            while k < len(units):
                cand = units[:k] + units[k + n:]
                if cand != units and _fails_same(joiner.join(cand), key):
                    units, changed = cand, True
                else:
                    k += n
            if not changed:
                n //= 2
        return units

    src = "\n".join(pass_over(src.split("\n"), "\n"))
    toks = re.findall(r"\s+|\w+|\S", src)
    src = "".join(pass_over(toks, ""))
    return "".join(pass_over(list(src), ""))


def hunt(n: int, start: int = 0) -> None:
    found: dict[str, tuple[str, BaseException]] = {}
    for kind, make in KINDS.items():
        for seed in range(start, start + n):
            src = make(RandomRand(seed * 7919 + len(kind)))
            try:
                compile_program(src)
            except Exception as e:  # noqa: BLE001
                key = bug_key(e)
                if key not in found or len(src) < len(found[key][0]):
                    found[key] = (src, e)
    print(f"{len(found)} distinct internal errors\n")
    for key, (src, _) in sorted(found.items()):
        small = minimize(src, key)
        try:
            compile_program(small)
        except Exception as e:  # noqa: BLE001
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-4:])
        print("=" * 100)
        print(key)
        print("--- program:")
        print(repr(small))
        print(small)
        print("--- traceback (last frames):")
        print(tb)


def stats(n: int, start: int = 0) -> None:
    for kind, make in KINDS.items():
        counts = Counter(outcome(make(RandomRand(seed))) for seed in range(start, start + n))
        share = ", ".join(f"{k} {100 * v / n:.0f}%" for k, v in counts.most_common())
        print(f"{kind:15} {share}")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "stats"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    first = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    {"stats": stats, "hunt": hunt}[cmd](count, first)
