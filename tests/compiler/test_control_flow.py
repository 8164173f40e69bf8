"""Counted loops (`for k in range(...)`), `if`/`elif`/`else`, loop variables that grow by a fixed
size each pass, and `last` (check/flow.py, ops/loops.py, ops/selecting.py): each against Python and
PyTorch written by hand in f64 (values and gradients), with the types the checker gives and the code
of each misuse. (tests/several/test_control_flow_several.py runs them on several devices and
layouts; tests/examples/test_nanogpt_training.py runs nanoGPT's accumulation and generation.)"""

from __future__ import annotations

import pytest
import torch
from test_more_ops import DIMS, against_torch, labels, r

import shapescript as ss
from shapescript.errors import CompileError


def errors(src: str) -> list[tuple[str, str]]:
    """(code, message) of each diagnostic of `src`."""
    with pytest.raises(CompileError) as info:
        ss.load(DIMS + src + "\n", name="flow.ss")
    return [(d.code, d.message) for d in info.value.diagnostics]


def grow_reference(x: torch.Tensor, times: int) -> torch.Tensor:
    for _ in range(times):
        x = torch.cat((x, x[:, -1:] * 0.5), 1)
    return x


# (name, the function f, its inputs, the same in PyTorch)
CASES = [
    ("range", "fn f(x: [b D] f64) -> [b D] f64:\n    y = x\n    for k in range(3):\n        y = y * 2.0 + x\n"
     "    return y", (r(2, 3),), lambda x: ((x * 2 + x) * 2 + x) * 2 + x),
    ("range-from-to-a-dim", "fn f(x: [b D] f64) -> [b D] f64:\n    y = x\n    for k in range(1, C):\n"
     "        y = y + take(x, k - 1, over=D) * x\n    return y",
     (r(2, 3),), lambda x: x + x[:, 0:1] * x + x[:, 1:2] * x + x[:, 2:3] * x),
    ("range-of-an-int", "fn f(x: [b D] f64, n: int) -> [b D] f64:\n    y = x\n    for k in range(n):\n"
     "        y = y * 0.5\n    return y", (r(2, 3), 4), lambda x, n: x * 0.5 ** 4),
    ("nested", "fn f(x: [b D] f64) -> [b D] f64:\n    y = x\n    for i in range(2):\n        for j in range(3):\n"
     "            y = y + x\n    return y", (r(2, 3),), lambda x: x * 7),
    ("grows", "fn f(x: [b n] f64) -> [b (n + 3)] f64:\n    for i in range(3):\n"
     "        x = cat(x, window(x, -1, 1, over=n) * 0.5, over=n)\n    return x",
     (r(2, 4),), lambda x: grow_reference(x, 3)),
    ("grows-by-a-dim", "fn f(x: [b n] f64) -> [b (n + 2 * C)] f64:\n    for i in range(C):\n"
     "        x = pad(x, 1, 1, over=n, value=1.5)\n    return x",
     (r(2, 4),), lambda x: torch.nn.functional.pad(x, (4, 4), value=1.5)),
    ("if-else", "fn f(x: [b D] f64, flag: bool) -> [b D] f64:\n    if flag:\n        y = x * 2.0\n    else:\n"
     "        y = exp(x)\n    return y", (r(2, 3), torch.tensor(False)), lambda x, flag: torch.exp(x)),
    ("if-on-a-value", "fn f(x: [b D] f64) -> [b D] f64:\n    s = sum(x * x)\n    if s > 100.0:\n"
     "        return x * 0.0\n    elif s > 1.0:\n        return x / s\n    return x", (r(2, 3),),
     lambda x: x / (x * x).sum()),
    ("if-in-a-loop", "fn f(x: [b D] f64) -> [b D] f64:\n    y = x\n    for k in range(4):\n        if k == 2:\n"
     "            y = y * 3.0\n        else:\n            y = y + 1.0\n    return y", (r(2, 3),),
     lambda x: (x + 2) * 3 + 1),
    ("remainder", "fn f(x: [b D] f64) -> [b D] f64:\n    y = x % 0.75\n    for k in range(5):\n"
     "        if k % 2 == 0:\n            y = y * 2.0\n    return y", (r(2, 3),),
     lambda x: torch.remainder(x, 0.75) * 8),
    ("put", "fn f(x: [b n D] f64, v: [b D] f64) -> [b n D] f64 = put(x, 1, v, over=n)", (r(2, 4, 3), r(2, 3)),
     lambda x, v: torch.cat((x[:, :1], v[:, None], x[:, 2:]), 1)),
    ("put-from-the-end-in-a-loop", "fn f(x: [b n D] f64) -> [b n D] f64:\n    y = x\n    for k in range(2):\n"
     "        y = put(y, -1 - k, take(y, k, over=n) * 2.0, over=n)\n    return y", (r(2, 5, 3),),
     lambda x: torch.cat((x[:, :3], x[:, 1:2] * 2, x[:, 0:1] * 2), 1)),
    ("last", "dim S = 6\n\nfn f(x: [b S D] f64) -> [b C D] f64 = last(x, C, over=S)", (r(2, 6, 3),),
     lambda x: x[:, -4:]),
    ("last-all", "dim S = 2\n\nfn f(x: [b S D] f64) -> [b S D] f64 = last(x, C, over=S)", (r(2, 2, 3),), lambda x: x),
]


def test_last_of_an_unknown_size_is_a_size_of_its_own_that_a_function_takes() -> None:
    src = ("fn total(x: [b k D] f64) -> [b D] f64 = sum(x, over=k)\n\n"
           "fn f(x: [b n D] f64) -> [b D] f64 = total(last(x, C, over=n))")
    for n in (2, 4, 7):
        x = r(2, n, 3)
        against_torch(src, (x,), lambda x: x[:, -4:].sum(1))


@pytest.mark.parametrize("name, src, inputs, reference", CASES, ids=[c[0] for c in CASES])
def test_against_python_and_torch(name: str, src: str, inputs: tuple, reference) -> None:
    tensors = tuple(x for x in inputs if isinstance(x, torch.Tensor))
    if len(tensors) == len(inputs):
        against_torch(src, inputs, reference)
    else:  # an int argument: the generated function with it bound
        prog = ss.load(DIMS + src + "\n", name="flow.ss")
        x = inputs[0].clone().requires_grad_()
        out = prog.namespace["f"](x, *inputs[1:])
        torch.testing.assert_close(out, reference(*inputs), rtol=0, atol=1e-12)


def test_both_branches_run_as_python_does() -> None:
    prog = ss.load(DIMS + CASES[6][1] + "\n", name="flow.ss")
    x = r(2, 3)
    torch.testing.assert_close(prog.f(x, torch.tensor(True)), x * 2)
    torch.testing.assert_close(prog.f(x, torch.tensor(False)), torch.exp(x))
    big = ss.load(DIMS + CASES[7][1] + "\n", name="flow.ss")
    assert torch.equal(big.f(x * 100), x * 0) and torch.equal(big.f(x * 1e-3), x * 1e-3)


def test_a_growing_value_has_a_size_of_its_own_in_the_loop_and_a_known_one_after() -> None:
    wrong = "fn f(x: [b n] f64) -> [b (n + 2)] f64:\n    for i in range(3):\n        x = pad(x, 0, 1, over=n)\n    return x"
    assert errors(wrong) == [("E0305", "`f` must return [b n+2] f64, but this is [b n+3] f64")]
    inside = ("fn f(x: [b n] f64) -> [b (n + 3)] f64:\n    for i in range(3):\n        x = pad(x, 0, 1, over=n)\n"
              "        y = x + window(x, 0, n, over=n)\n    return x")
    (code, message), = errors(inside)
    assert code == "E0301" and "[b n+i+1] f64 and [b n] f64" in message  # in the body, any size from n on


def test_a_loop_that_grows_a_value_by_different_sizes_is_e0406() -> None:
    doubling = "fn f(x: [b n] f64) -> [b n] f64:\n    for i in range(3):\n        x = cat(x, x, over=n)\n    return x"
    assert errors(doubling)[0] == ("E0406", "`x` is [b n] f64 before the loop, but a pass of the loop makes it "
                                            "[b 2*n] f64")
    shrinking = "fn f(x: [b n] f64) -> [b n] f64:\n    for i in range(3):\n        x = window(x, 1, 2, over=n)\n    return x"
    assert errors(shrinking)[0][0] == "E0406"


def test_after_a_loop_of_a_count_only_the_run_knows_a_grown_size_is_its_own() -> None:
    src = "fn f(x: [b n] f64, k: int) -> [b n] f64:\n    for i in range(k):\n        x = pad(x, 0, 1, over=n)\n    return x"
    (code, message), = errors(src)
    assert code == "E0305" and "n+passes" in message


@pytest.mark.parametrize("src, code, words", [
    ("fn f(x: [b D]) -> [b D]:\n    if x > 1.0:\n        return x\n    return x", "E0409", "one bool, not [b D] bool"),
    ("fn f(x: [b D], k: int) -> [b D]:\n    if k:\n        return x\n    return x", "E0409", "a bool, not int"),
    ("fn f(x: [b D], flag: bool) -> [b D]:\n    y = x\n    if flag:\n        y = sum(x, over=D)\n    return y",
     "E0410", "`y` is [b] after one branch and [b D] after the other"),
    ("fn f(x: [b D], flag: bool) -> [b D]:\n    if flag:\n        y = x\n    return y", "E0201",
     "`y` is assigned in one branch of the `if` on line 5 only"),
    ("fn f(x: [b D], flag: bool) -> [b D]:\n    if flag:\n        return x", "E0305", "has no `return`"),
    ("fn f(x: [b D]) -> [b D]:\n    for k in range(2.5):\n        x = x\n    return x", "E0401",
     "a bound of `range` is a whole number, not float"),
    ("fn f(x: [b D]) -> [b D]:\n    for k in range(5, 2):\n        x = x\n    return x", "E0310", "counts backwards"),
    ("fn f(x: [b D]) -> [b D]:\n    for k in x:\n        x = x\n    return x", "E0403", "or a range"),
    ("fn f(x: [b n D]) -> [b D] = sum(last(x, 0, over=n), over=n)", "E0310", "`last`'s count"),
    ("fn f(x: [b C D], v: [b C]) -> [b C D] = put(x, 0, v, over=C)", "E0301", "`put` writes an entry"),
    ("fn f(x: [b C D], v: [b D]) -> [b C D] = put(x, 4, v, over=C)", "E0309", "`put` at position 4"),
])
def test_misuses(src: str, code: str, words: str) -> None:
    found = errors(src)
    assert any(c == code and words in m for c, m in found), found


def test_if_and_loops_parse_as_blocks() -> None:
    for src in ("fn f(x: [b D]) -> [b D]:\n    else:\n        return x\n",
                "fn f(x: [b D], flag: bool) -> [b D]:\n    if flag\n        return x\n    return x\n"):
        with pytest.raises(CompileError) as info:
            ss.load(DIMS + src, name="flow.ss")
        assert info.value.diagnostics[0].code.startswith("E01")


def test_topk_of_a_declared_dim_names_its_axis() -> None:
    src = ("dim K = 2\n\nfn f(x: [b V] f64) -> [b V] f64:\n    top, _ = topk(x, K, over=V)\n"
           "    return masked_fill(x, x < take(top, -1, over=K), 0.0)")
    x = r(3, 5)
    kth = x.topk(2, dim=1).values[:, -1:]
    against_torch(src, (x,), lambda x: x.masked_fill(x < x.topk(2, dim=1).values[:, -1:], 0.0))
    assert kth.shape == (3, 1) and labels(2, 1).shape == (1,)


def test_a_value_that_grows_on_some_passes_only_is_refused() -> None:
    """The first pass grows it by one, the second would take it back to its first size: the check of
    a pass from any size finds the difference (E0406 on the pass, E0410 on the branches)."""
    src = ("fn f(x: [b n] f64) -> [b n] f64:\n    for i in range(3):\n        if i == 0:\n"
           "            x = pad(x, 0, 1, over=n)\n    return x")
    assert [code for code, _ in errors(src)] == ["E0410"]
