"""Elaboration (shapescript/check/elaborate.py), the checker's last step: the checked program as
typed IR nodes, each carrying its checked type and its resolved call, with nothing of the plans
yet; the plans' passes then leave the batch split's marks on them. The IR holds no syntax node."""

from __future__ import annotations

import dataclasses

import pytest
from facts import FILE, build, combined_ops, line_of
from programs import LIN_HEADER, LINEAR, SPLIT_OPS

from shapescript.check.checker import check_program
from shapescript.devices import DeviceSet
from shapescript.ir import nodes as N
from shapescript.ir.walk import walk
from shapescript.pipeline import parse_devices
from shapescript.shapes import value_types as T
from shapescript.shapes.plans import ANYWHERE, Combine
from shapescript.syntax import tree as A
from shapescript.syntax.parser import parse


def ir_of(source: str, devices: str = "cpu") -> N.Module:
    """The planned IR, as lowering and the DeviceTable read it."""
    return build(source, devices).module


def elaborated(source: str, devices: DeviceSet) -> N.Module:
    """The IR as checking leaves it, before any plan."""
    return check_program(parse(source, FILE), FILE, devices).module


def shown(t: T.Ty) -> str:
    return t.show()


def test_every_function_in_the_source_order_with_its_signature() -> None:
    module = ir_of(LINEAR)
    assert [f.name for f in module.functions] == ["scores", "loss", "step", "fit"]
    step = module.function("step")
    assert [(p.name, shown(p.ty), p.mut) for p in step.params] == [
        ("m", "Lin", True), ("opt", "AdamW[Lin]", True), ("batch", "[b] Ex", False)]
    assert shown(step.ret) == "[]" and step.kind == "fn"
    assert step.span.line == line_of(LINEAR, "fn step(")


def test_expressions_carry_their_checked_types_and_resolved_calls() -> None:
    module = ir_of(LINEAR)
    (ret,) = module.function("scores").body
    assert isinstance(ret, N.Return) and isinstance(ret.value, N.BinOp)
    product = ret.value
    assert product.op == "@" and shown(product.ty) == "[b C]"
    assert isinstance(product.left, N.Name) and product.left.id == "x" and shown(product.left.ty) == "[b D]"
    w = product.right
    assert isinstance(w, N.Member) and w.name == "w" and w.live  # a model's tensor: the live one
    (ret,) = module.function("loss").body
    loss = ret.value
    assert isinstance(loss, N.OpCall) and loss.op == "cross_entropy" and shown(loss.ty) == "[]"
    assert loss.options.axis == 1  # over=C: the scores' axis 1
    scores, labels = loss.args
    assert isinstance(scores, N.FnCall) and (scores.kind, scores.name) == ("fn", "scores")
    assert isinstance(labels, N.Member) and not labels.live  # a batch's field
    assign, update, _ = module.function("step").body
    assert isinstance(assign, N.Assign) and [(t.name, shown(t.ty)) for t in assign.targets] == [
        ("l", "[]"), ("g", "Grad[Lin]")]
    assert isinstance(assign.value, N.GradCall) and assign.value.fn == "loss"
    assert isinstance(update, N.Do) and isinstance(update.expr, N.OpCall) and update.expr.op == "update"
    (loop,) = module.function("fit").body
    assert isinstance(loop, N.For) and loop.var.name == "batch" and shown(loop.var.ty) == "[b] Ex"
    assert loop.var.span.line == loop.span.line
    assert isinstance(loop.iter, N.OpCall) and loop.iter.op == "batches" and loop.iter.options.data == "Ex"


def test_a_dim_used_as_a_number_is_read_off_a_parameter() -> None:
    source = LIN_HEADER + "\nfn f(x: [n D]) -> [] = sum(x) / n\n"
    f = ir_of(source).function("f")
    sizes = [e for e in walk(f.body) if isinstance(e, N.Size)]
    assert [s.source for s in sizes] == [("x", 0)]
    assert f.sizes == (("x", 0),)  # read once, before the body
    fixed = ir_of(LIN_HEADER + "\nfn g(x: [D]) -> [] = sum(x) / D\n").function("g")
    assert [e.source for e in walk(fixed.body) if isinstance(e, N.Size)] == [4] and fixed.sizes == ()


def test_an_axis_argument_is_passed_as_its_index() -> None:
    source = LIN_HEADER + ('\nextern fn norm_along(x: [n D], over: Axis[D]) -> [n D] = "shapescript.std.layer_norm"\n'
                           "fn f(x: [n D]) -> [n D] = norm_along(x, over=D)\n")
    (ret,) = ir_of(source).function("f").body
    assert isinstance(ret.value, N.FnCall) and ret.value.kind == "extern"
    assert isinstance(ret.value.args[0], N.Name) and isinstance(ret.value.args[1], N.AxisArg)
    assert ret.value.args[1].index == 1 and shown(ret.value.args[1].ty) == "Axis[D]"
    assert ir_of(source).function("norm_along").target == "shapescript.std.layer_norm"


def test_the_batch_split_is_on_the_nodes_on_several_devices_only() -> None:
    one, two = ir_of(LINEAR), ir_of(LINEAR, "cpu[0 1]")
    assert one.function("loss").split is None
    split = two.function("step").split
    assert split is not None and split.params == (None, None, 0) and split.result is None
    across = [(type(e).__name__, getattr(e, "op", ""), e.across) for f in two.functions for e in walk(f.body)
              if isinstance(e, (N.OpCall, N.BinOp)) and e.across]
    assert across == [("OpCall", "cross_entropy", Combine.OWN)]  # its own lowering: all_cross_entropy
    assert not [e for f in one.functions for e in walk(f.body) if getattr(e, "across", None)]
    placed = {f.name: f.placement.where for f in two.functions}
    assert placed == {"scores": "workers", "loss": "workers", "step": "workers", "fit": "controller"}


def test_checking_leaves_the_ir_unplanned() -> None:
    """Elaboration knows nothing of the plans: every function anywhere, nothing split or combined,
    on any devices; the passes of plan/ add what they find."""
    module = elaborated(SPLIT_OPS, parse_devices("cpu[0 1]"))
    assert all(f.placement == ANYWHERE and f.split is None for f in module.functions)
    assert not [e for f in module.functions for e in walk(f.body)
                if getattr(e, "across", None) or isinstance(e, N.Heads) or getattr(e, "gathered", False)]
    assert module.heads is None and not module.head_params


def test_the_split_marks_every_op_that_combines() -> None:
    marked = sorted((e.op, e.span.line) for f in ir_of(SPLIT_OPS, "cpu[0 1]").functions for e in walk(f.body)
                    if isinstance(e, (N.OpCall, N.BinOp)) and e.across)
    assert marked == sorted(combined_ops(build(SPLIT_OPS, "cpu[0 1]"))) and len(marked) >= 5


def test_the_ir_is_frozen_and_holds_no_syntax_node() -> None:
    module = ir_of(LINEAR, "cpu[0 1]")

    def visit(value: object) -> None:
        assert not isinstance(value, A.Node), value
        if isinstance(value, T.Ty):  # the checker's types: shared, and named by the IR, not copied
            return
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                visit(getattr(value, field.name))
        elif isinstance(value, (tuple, list)):
            for item in value:
                visit(item)

    for fn in module.functions:
        for s in fn.body:
            visit(s)
    with pytest.raises(dataclasses.FrozenInstanceError):
        module.functions[0].body[0].span = None  # type: ignore[misc]
    assert FILE == module.file
