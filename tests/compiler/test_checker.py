"""The checker's facts: types, generic binding, broadcasting by name, placement, error recovery."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch
from programs import README

import shapescript as ss
from shapescript.errors import CompileError
from shapescript.pipeline import check_source
from shapescript.plan.comms import device_table
from shapescript.shapes import value_types as T


def check(src: str):
    return check_source(textwrap.dedent(src), "t.ss")


def body_expr(checked, fn: str, k: int = -1):
    node = checked.fns[fn].node.body[k]
    return node.value


def test_readme_types_and_placement() -> None:
    c = check_source(README, "mlp.ss")
    assert c.device_set.count == 3 and c.device_set.kind == "cuda" and device_table(c).count == 3
    assert c.type_of(body_expr(c, "forward")).show() == "[b C]"
    assert {n: c.placement(n).where for n in c.fns} == {
        "forward": "workers", "loss": "workers", "train_step": "workers", "run": "controller"}
    assert c.placement("run").reason == "loops over a dataset"
    vg = c.fns["train_step"].node.body[0].value
    assert c.calls[vg].kind == "grad" and c.calls[vg].name == "loss"
    assert c.type_of(vg).show() == "([], Grad[Mlp])"
    assert c.dim_values == {"D": 784, "Hd": 256, "C": 10}


def test_generic_dims_are_bound_per_call() -> None:
    c = check("""\
        dim D = 4
        fn row_sums(x: [b D]) -> [b] = sum(x, over=D)
        fn twice(x: [n D], y: [m D]) -> [n] = row_sums(x) + row_sums(x)
        fn other(y: [m D]) -> [m] = row_sums(y)
        """)
    assert c.type_of(body_expr(c, "other")).show() == "[m]"
    assert c.type_of(body_expr(c, "twice")).show() == "[n]"


def test_dim_arithmetic_and_groups_compare_by_value() -> None:
    check("""\
        dim H = 2
        dim Dh = 3
        fn same(x: [n (H Dh)]) -> [n H*Dh] = x
        fn flat(x: [n Dh*H]) -> [n (H Dh)] = x
        fn plus(x: [n+1]) -> [1+n] = x
        """)
    with pytest.raises(CompileError) as info:
        check("dim H = 2\nfn f(x: [n H]) -> [n H+1] = x\n")
    assert info.value.codes == ["E0305"]


@pytest.mark.parametrize("src, x_shape, y_shape, reference", [
    ("fn f(x: [b C], y: [b]) -> [b C] = x - y", (5, 3), (5,), lambda x, y: x - y[:, None]),
    ("fn f(x: [b C], y: [C]) -> [b C] = x - y", (5, 3), (3,), lambda x, y: x - y),
    ("fn f(x: [b], y: [b C]) -> [b C] = x - y", (5,), (5, 3), lambda x, y: x[:, None] - y),
    ("fn f(x: [C], y: [b C]) -> [b C] = x * y", (3,), (5, 3), lambda x, y: x * y),
])
def test_broadcasting_by_name_lowers_to_the_right_axes(src, x_shape, y_shape, reference) -> None:
    prog = ss.load("dim C = 3\n" + src + "\n", name="b.ss")
    x, y = torch.randn(*x_shape), torch.randn(*y_shape)
    assert torch.equal(prog.f(x, y), reference(x, y))


def test_reductions_and_softmax_pick_the_named_axis() -> None:
    prog = ss.load(textwrap.dedent("""\
        dim C = 3
        fn a(x: [b C]) -> [b] = max(x, over=C)
        fn s(x: [b C]) -> [b C] = softmax(x, over=b)
        fn am(x: [b C]) -> [C] Index[b] = argmax(x, over=b)
        fn total(x: [b C]) -> [] = logsumexp(x)
        """), name="r.ss")
    x = torch.randn(4, 3)
    assert torch.equal(prog.a(x), x.amax(dim=1))
    assert torch.equal(prog.s(x), torch.softmax(x, dim=0))
    assert torch.equal(prog.am(x), x.argmax(dim=0))
    torch.testing.assert_close(prog.total(x), torch.logsumexp(x.flatten(), dim=0))


def test_several_errors_are_reported_without_cascades() -> None:
    with pytest.raises(CompileError) as info:
        check("""\
            dim D = 4
            dim E = 5
            fn f(x: [n D]) -> [n] = sum(unknown_thing(x), over=D) + 1
            fn g(x: [n D], w: [E D]) -> [n D] = x @ w
            """)
    assert info.value.codes == ["E0201", "E0304"]
    assert "2 errors found" in str(info.value)


def test_device_work_in_the_controller_is_only_refused_on_several_devices() -> None:
    from shapescript.codes import CODES
    example = CODES["E1803"].example
    one = re.sub(r"devices \w+\[[\d ]+\]", "devices cpu", example)  # the index's example is on cuda[...]
    assert one != example
    c = check_source(one, "one.ss")
    assert c.placement("fit").where == "controller"
    with pytest.raises(CompileError):
        check_source(example, "three.ss")
    with pytest.raises(CompileError):
        check_source(one, "x.ss", devices=ss.api.parse_devices("cpu[0 1]"))


def test_placement_anywhere_and_callers_of_controller_functions() -> None:
    c = check("""\
        fn add(a: int, b: int) -> int = a + b
        fn show(x: [n]):
            print(x)
        fn outer(x: [n]):
            show(x)
        fn inner(x: [n]) -> [n] = x * 2
        """)
    assert c.placement("add").where == "anywhere"
    assert c.placement("outer").where == "controller"
    assert "calls `show`" in c.placement("outer").reason
    assert c.placement("inner").where == "workers"


def test_reserved_member_names_are_refused() -> None:
    with pytest.raises(CompileError) as info:
        check("model M:\n    param params: [3] = zeros()\n\ndata X:\n    size: [3]\n")
    assert info.value.codes == ["E0207", "E0207"]


def test_python_scalars_and_literals() -> None:
    c = check("""\
        fn half(x: [n]) -> [n] = x / 2
        fn count(k: int) -> int = k * 2 + 1
        fn ratio(k: int) -> float = k / 2
        """)
    assert c.fns["count"].ret == T.INT
