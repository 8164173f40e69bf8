"""`torch.compile(prog.f)`: a program's function compiles as one graph (its arguments' checks run
before it, eagerly), gives what the eager call gives, and still refuses a wrong argument with the
ShapeError of the .ss parameter. The built module is a module in sys.modules, where the tracer
looks a function's globals up, and it leaves with its program."""

from __future__ import annotations

import gc
import sys

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

import shapescript as ss

SOURCE = """\
dim D = 6
dim H = 5
dim C = 3

model Mlp:
    param w1: [D H] = normal(std=0.3)
    param w2: [H C] = normal(std=0.3)

fn forward(m: Mlp, x: [b D]) -> [b C] = relu(x @ m.w1) @ m.w2

fn loss(m: Mlp, x: [b D], y: [b] Index[C]) -> [] = cross_entropy(forward(m, x), y, over=C)
"""


@pytest.fixture
def prog() -> ss.Program:
    torch._dynamo.reset()
    return ss.load(SOURCE, name="compiled.ss")


def test_a_function_compiles_as_one_graph_and_equals_the_eager_call(prog: ss.Program) -> None:
    counter = CompileCounter()
    compiled = torch.compile(prog.forward, backend=counter)
    m = prog.Mlp.init(seed=0)
    x = torch.randn(4, 6)
    torch.testing.assert_close(compiled(m, x), prog.forward(m, x), atol=1e-6, rtol=1e-6)
    assert counter.frame_count == 1 and counter.op_count >= 3  # two products and the relu, in one graph
    explained = torch._dynamo.explain(prog.loss)(m, x, torch.tensor([0, 1, 2, 0]))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_the_arguments_are_still_checked(prog: ss.Program) -> None:
    compiled = torch.compile(prog.loss, backend="eager")
    m = prog.Mlp.init(seed=0)
    with pytest.raises(ss.ShapeError, match=r"`x` of `loss` .*dim 1 is 7, not D = 6"):
        compiled(m, torch.randn(4, 7), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ss.DomainError, match="outside Index"):
        compiled(m, torch.randn(4, 6), torch.tensor([0, 1, 2, 3]))


def test_inductor_gives_the_eager_values(prog: ss.Program) -> None:
    compiled = torch.compile(prog.loss)
    m = prog.Mlp.init(seed=0)
    x, y = torch.randn(8, 6), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    torch.testing.assert_close(compiled(m, x, y), prog.loss(m, x, y), atol=1e-5, rtol=1e-5)


def test_the_module_is_in_sys_modules_while_its_program_lives() -> None:
    prog = ss.load(SOURCE, name="compiled.ss")
    name = prog.namespace["__name__"]
    assert sys.modules[name].__dict__ is prog.namespace
    other = ss.load(SOURCE, name="compiled.ss")
    assert other.namespace["__name__"] != name  # the same file twice: two modules
    del prog
    gc.collect()
    assert name not in sys.modules
