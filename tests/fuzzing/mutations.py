"""Mutants of valid programs and soups of tokens: the seeds, the vocabulary, the mutations."""

from __future__ import annotations

import re
from pathlib import Path

from fuzzing.rand import Rand
from shapescript.codes import CODES

ROOT = Path(__file__).resolve().parent.parent.parent


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

KEYWORDS = ["fn", "mut", "return", "for", "in", "if", "elif", "else", "and", "or", "not", "true", "false"]
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
