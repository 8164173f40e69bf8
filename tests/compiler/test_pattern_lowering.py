"""rearrange, split, repeat and reduce print as plain torch (`.unflatten`, `.permute`, `.flatten`,
`.unbind`, `.expand`, `.sum`...): each call's line has no runtime pattern call, and it computes
what runtime/patterns.py's interpretation of the same recipe computes, and what hand-written torch
computes, values, dtypes and gradients alike, exactly, for random sizes of the program's dims and of
the generic ones."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cache
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from programs import GPT

import shapescript as ss
from shapescript.api import compile_program
from shapescript.lower.targets import Target
from shapescript.ops import OPS
from shapescript.ops.shaping import recipe_parts, reduce_parts, repeat_parts, runtime_call
from shapescript.pipeline import python_module

HEADER = """\
dim H
dim Dh
dim R

data Ex:
    x: [n Dh]

"""

Sizes = dict[str, int]
Reference = Callable[[torch.Tensor, Sizes], torch.Tensor]


@dataclass(frozen=True)
class Case:
    """A function of one tensor (or of a batch of Ex), its operand's shape, and torch written by hand."""

    source: str  # the .ss function, named as the case
    shape: Callable[[Sizes], tuple[int, ...]]
    reference: Reference
    dtype: torch.dtype = torch.float32


CASES: dict[str, Case] = {
    # rearrange: a split, a merge, a permutation, a flattening, literal 1s dropped, sizes read or inferred
    "heads": Case("fn heads(x: [b n (H Dh)]) -> [b H n Dh] = rearrange(x, b n (h d) -> b h n d)",
                  lambda s: (s["b"], s["n"], s["H"] * s["Dh"]),
                  lambda x, s: x.reshape(s["b"], s["n"], s["H"], s["Dh"]).transpose(1, 2)),
    "merged": Case("fn merged(x: [b H n Dh]) -> [b n (H Dh)] = rearrange(x, b h n d -> b n (h d))",
                   lambda s: (s["b"], s["H"], s["n"], s["Dh"]),
                   lambda x, s: x.transpose(1, 2).reshape(s["b"], s["n"], s["H"] * s["Dh"])),
    "swap": Case("fn swap(x: [b n Dh]) -> [Dh b n] = rearrange(x, b n d -> d b n)",
                 lambda s: (s["b"], s["n"], s["Dh"]), lambda x, s: x.movedim(2, 0)),
    "whole": Case("fn whole(x: [b n Dh]) -> [(b n Dh)] = rearrange(x, b n d -> (b n d))",
                  lambda s: (s["b"], s["n"], s["Dh"]), lambda x, s: x.reshape(-1)),
    "ones": Case("fn ones(x: [b 1 Dh]) -> [Dh b] = rearrange(x, b 1 d -> d b)",
                 lambda s: (s["b"], 1, s["Dh"]), lambda x, s: x[:, 0, :].t()),
    "inner_one": Case("fn inner_one(x: [b (1 Dh)]) -> [Dh b] = rearrange(x, b (1 d) -> d b)",
                      lambda s: (s["b"], s["Dh"]), lambda x, s: x.t()),
    "read": Case("fn read(x: [b n (b n)]) -> [b n n b] = rearrange(x, p q (r s) -> p s q r)",
                 lambda s: (s["b"], s["n"], s["b"] * s["n"]),
                 lambda x, s: x.reshape(s["b"], s["n"], s["b"], s["n"]).permute(0, 3, 1, 2)),
    "inferred": Case("fn inferred(x: [n (n Dh)]) -> [n Dh n] = rearrange(x, a (c d) -> a d c)",
                     lambda s: (s["n"], s["n"] * s["Dh"]),
                     lambda x, s: x.reshape(s["n"], s["n"], s["Dh"]).transpose(1, 2)),
    "batched": Case("fn batched(batch: [b] Ex) -> [b Dh n] = rearrange(batch.x, b n d -> b d n)",
                    lambda s: (s["b"], s["n"], s["Dh"]), lambda x, s: x.transpose(1, 2)),
    # split into parts: the parts' axis anywhere, with a permutation and a merge of each part
    "qkv": Case("fn qkv(x: [b n (3 H Dh)]) -> [b H n Dh]:\n"
                "    q, k, v = split(x, b n (3 h d) -> b h n d)\n"
                "    return q - 2.0 * k + 4.0 * v",
                lambda s: (s["b"], s["n"], 3 * s["H"] * s["Dh"]),
                lambda x, s: combine(p.transpose(1, 2) for p in
                                     torch.unbind(x.reshape(s["b"], s["n"], 3, s["H"], s["Dh"]), 2))),
    "halves": Case("fn halves(x: [b (2 Dh)]) -> [b Dh]:\n"
                   "    p, q = split(x, b (2 d) -> b d)\n"
                   "    return p - 2.0 * q",
                   lambda s: (s["b"], 2 * s["Dh"]), lambda x, s: combine(x.chunk(2, dim=1))),
    "leading": Case("fn leading(x: [3 b Dh]) -> [b Dh]:\n"
                    "    p, q, r = split(x, 3 b d -> b d)\n"
                    "    return p - 2.0 * q + 4.0 * r",
                    lambda s: (3, s["b"], s["Dh"]), lambda x, s: combine(torch.unbind(x, 0))),
    "part_merge": Case("fn part_merge(x: [b (3 H Dh)]) -> [(Dh H) b]:\n"
                       "    p, q, r = split(x, b (3 H Dh) -> (Dh H) b)\n"
                       "    return p - 2.0 * q + 4.0 * r",
                       lambda s: (s["b"], 3 * s["H"] * s["Dh"]),
                       lambda x, s: combine(p.permute(2, 1, 0).reshape(s["Dh"] * s["H"], s["b"]) for p in
                                            torch.unbind(x.reshape(s["b"], 3, s["H"], s["Dh"]), 1))),
    # repeat: a new axis alone, merged after or before a kept one, among permuted ones
    "rep_new": Case("fn rep_new(x: [b Dh]) -> [b R Dh] = repeat(x, b d -> b r d, r=R)",
                    lambda s: (s["b"], s["Dh"]), lambda x, s: x.unsqueeze(1).repeat(1, s["R"], 1)),
    "rep_after": Case("fn rep_after(x: [b Dh]) -> [b (Dh R)] = repeat(x, b d -> b (d r), r=R)",
                      lambda s: (s["b"], s["Dh"]), lambda x, s: x.repeat_interleave(s["R"], dim=1)),
    "rep_before": Case("fn rep_before(x: [b Dh]) -> [(R b) Dh] = repeat(x, b d -> (r b) d, r=R)",
                       lambda s: (s["b"], s["Dh"]), lambda x, s: x.repeat(s["R"], 1)),
    "rep_split": Case("fn rep_split(x: [b (H Dh)]) -> [Dh R b H] = repeat(x, b (h d) -> d r b h, r=R)",
                      lambda s: (s["b"], s["H"] * s["Dh"]),
                      lambda x, s: x.reshape(s["b"], s["H"], s["Dh"]).permute(2, 0, 1).unsqueeze(1)
                      .repeat(1, s["R"], 1, 1)),
    # reduce: each operation, over split atoms, followed by a permutation and a merge
    "red_sum": Case("fn red_sum(x: [b n Dh]) -> [b Dh] = reduce(x, b n d -> b d, sum)",
                    lambda s: (s["b"], s["n"], s["Dh"]), lambda x, s: torch.sum(x, dim=1)),
    "red_max": Case("fn red_max(x: [b (H Dh)]) -> [Dh b] = reduce(x, b (h d) -> d b, max)",
                    lambda s: (s["b"], s["H"] * s["Dh"]),
                    lambda x, s: x.reshape(s["b"], s["H"], s["Dh"]).max(dim=1).values.t()),
    "red_mean": Case("fn red_mean(x: [b n Dh]) -> [(Dh b)] = reduce(x, b n d -> (d b), mean)",
                     lambda s: (s["b"], s["n"], s["Dh"]), lambda x, s: x.mean(dim=1).t().reshape(-1)),
    "red_min": Case("fn red_min(x: [b n Dh]) -> [] = reduce(x, b n d -> , min)",
                    lambda s: (s["b"], s["n"], s["Dh"]), lambda x, s: x.min()),
    "red_prod": Case("fn red_prod(x: [b n Dh]) -> [Dh] = reduce(x, b n d -> d, prod)",
                     lambda s: (s["b"], s["n"], s["Dh"]), lambda x, s: torch.prod(torch.prod(x, 1), 0)),
    "red_i32": Case("fn red_i32(x: [b n Dh] i32) -> [b] i64 = reduce(x, b n d -> b, sum)",
                    lambda s: (s["b"], s["n"], s["Dh"]), lambda x, s: x.to(torch.int64).sum(dim=(1, 2)),
                    torch.int32),
    "red_bool": Case("fn red_bool(x: [b n Dh] bool) -> [b] i64 = reduce(x, b n d -> b, sum)",
                     lambda s: (s["b"], s["n"], s["Dh"]), lambda x, s: x.to(torch.int64).sum(dim=(1, 2)),
                     torch.bool),
}

# The one kind of recipe kept as a runtime call: a size read off the shape of an operand that is not
# a name, which printing `x.shape[k]` would evaluate twice.
RUNTIME_CASES: dict[str, Case] = {
    "read_compound": Case("fn read_compound(x: [b n (b n)]) -> [b n n b] = rearrange(x * 2.0, p q (r s) -> p s q r)",
                          lambda s: (s["b"], s["n"], s["b"] * s["n"]),
                          lambda x, s: (x * 2.0).reshape(s["b"], s["n"], s["b"], s["n"]).permute(0, 3, 1, 2)),
}
ALL = {**CASES, **RUNTIME_CASES}
PROGRAM = HEADER + "\n".join(case.source for case in ALL.values()) + "\n"
PATTERN_CALL = re.compile(r"_rt\.(rearrange|split_parts|repeat|reduce)\(")


def combine(parts: Iterable[torch.Tensor]) -> torch.Tensor:
    """The split cases' functions return their parts as p - 2 q + 4 r, which tells them apart."""
    out = None
    for k, part in enumerate(parts):
        term = part if k == 0 else (-2.0 * part if k == 1 else 4.0 * part)
        out = term if out is None else out + term
    assert out is not None
    return out


@contextmanager
def runtime_lowering() -> Iterator[None]:
    """The pattern ops lowered as calls of runtime/patterns.py with their recipes, as they were."""
    saved = {name: OPS[name] for name in ("rearrange", "split", "repeat", "reduce")}
    lowerings = {"rearrange": runtime_call("rearrange", recipe_parts),
                 "split": runtime_call("split_parts", recipe_parts),
                 "repeat": runtime_call("repeat", repeat_parts), "reduce": runtime_call("reduce", reduce_parts)}
    try:
        for name, lower in lowerings.items():
            OPS[name] = replace(OPS[name], lower=lower)
        yield
    finally:
        OPS.update(saved)


def module_text(dims: tuple[int, int, int], runtime: bool = False) -> str:
    """The program's module for dims H, Dh, R; `runtime`: with the pattern ops' runtime calls."""
    checked = compile_program(PROGRAM, "patterns.ss", None, dict(zip(("H", "Dh", "R"), dims)))
    if runtime:
        with runtime_lowering():
            return python_module(checked)
    return python_module(checked)


@cache
def functions(dims: tuple[int, int, int], runtime: bool) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "pattern_lowering_test"}
    exec(compile(module_text(dims, runtime), "<patterns.ss>", "exec"), namespace)
    return namespace


def function_lines(text: str, name: str) -> list[str]:
    """The lines of the generated function `name`, up to the next top-level statement."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(f"def {name}("))
    end = next((k for k in range(start + 1, len(lines)) if lines[k] and not lines[k][0].isspace()), len(lines))
    return lines[start:end]


@pytest.mark.parametrize("name", list(CASES))
def test_the_line_is_torch_without_a_runtime_pattern_call(name: str) -> None:
    body = function_lines(module_text((2, 3, 4)), name)
    assert not any(PATTERN_CALL.search(line) for line in body), body
    # and the module the values are compared with below does call the runtime
    assert any(PATTERN_CALL.search(line) for line in function_lines(module_text((2, 3, 4), runtime=True), name))


def test_a_size_read_off_a_compound_operand_stays_a_runtime_call() -> None:
    body = function_lines(module_text((2, 3, 4)), "read_compound")
    assert any("_rt.rearrange(x * 2.0," in line for line in body), body
    read = function_lines(module_text((2, 3, 4)), "read")  # of a name: read off it, printed
    assert any("x.shape[1]" in line for line in read), read


def test_no_op_steps_print_nothing() -> None:
    text = module_text((2, 3, 4))
    assert "permute" not in "\n".join(function_lines(text, "whole"))  # only a flatten
    assert ".flatten(" not in "\n".join(function_lines(text, "heads"))  # a split and a permute
    assert any(line.strip().startswith("p, q, r = x.unbind(0)") for line in function_lines(text, "leading"))


def test_the_attention_example_reads_as_torch() -> None:
    text = python_module(compile_program(GPT, "gpt.ss", None, {"V": 11}))
    assert "q, k, v = _rt.matmul(x, m._m_w_qkv).unflatten(2, (3, 12, 64)).permute(2, 0, 3, 1, 4).unbind(0)" in text
    assert "return _rt.matmul(attention(q, k, v).permute(0, 2, 1, 3).flatten(2, 3), m._m_w_o)" in text


def test_on_several_devices_the_workers_print_torch_and_reduce_sums_their_parts() -> None:
    source = HEADER + (CASES["batched"].source + "\n"
                       "fn total(batch: [b] Ex) -> [Dh] = reduce(batch.x, b n d -> d, sum)\n")
    checked = compile_program(source, "several.ss", "cpu[0 1]", {"H": 2, "Dh": 3, "R": 4})
    text = python_module(checked, Target.WORKER)
    assert not PATTERN_CALL.search(text)
    assert "return batch.x.permute(0, 2, 1)" in text
    assert re.search(r"_rt\.all_sum\(batch\.x\.sum\(dim=\(0, 1\)\), ", text)  # each device's partial sum


def inputs(case: Case, sizes: Sizes, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    shape = case.shape(sizes)
    if case.dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if case.dtype == torch.int32:
        return torch.randint(-5, 6, shape, generator=g, dtype=torch.int32)
    return torch.randn(shape, generator=g, requires_grad=True)


def call(namespace: dict[str, Any], name: str, x: torch.Tensor) -> torch.Tensor:
    return namespace[name](SimpleNamespace(x=x) if name == "batched" else x)


def gradient(out: torch.Tensor, x: torch.Tensor, cotangent: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad((out * cotangent).sum(), x)
    return grad


SIZES = st.fixed_dictionaries({"H": st.integers(1, 3), "Dh": st.integers(1, 3), "R": st.integers(1, 3),
                               "b": st.integers(1, 4), "n": st.integers(1, 4)})


@pytest.mark.parametrize("name", list(ALL))
@settings(max_examples=15, deadline=None, derandomize=True, database=None)  # the same draws each run
@given(sizes=SIZES, seed=st.integers(0, 2**16))
def test_values_and_gradients_equal_the_runtime_and_hand_written_torch(name: str, sizes: Sizes, seed: int) -> None:
    case = ALL[name]
    dims = (sizes["H"], sizes["Dh"], sizes["R"])
    x = inputs(case, sizes, seed)
    printed, interpreted = call(functions(dims, False), name, x), call(functions(dims, True), name, x)
    by_hand = case.reference(x, sizes)
    for other in (interpreted, by_hand):
        assert printed.dtype == other.dtype and printed.shape == other.shape
        assert torch.equal(printed, other)
    if x.requires_grad:
        cotangent = torch.randn(printed.shape, generator=torch.Generator().manual_seed(seed + 1))
        grad = gradient(printed, x, cotangent)
        assert torch.equal(grad, gradient(interpreted, x, cotangent))
        assert torch.equal(grad, gradient(by_hand, x, cotangent))


def test_repeat_names_a_literal_it_would_drop() -> None:
    """The left side's literal 1 isn't kept by repeat: the error says so in words, not `None`."""
    with pytest.raises(ss.CompileError) as info:
        ss.load("fn f(x: [n 1]) -> [n 4] = repeat(x, n 1 -> n r, r=4)\n")
    (d,) = info.value.diagnostics
    assert d.code == "E0307" and d.message == "a literal size is on the left but not on the right"
    assert "rearrange" in " ".join(d.help)
