"""The op table (shapescript/ops/): each op in it is declared once, with everything the
stages need, and the stages name none of those ops themselves."""

from __future__ import annotations

import re

import pytest
from fuzzing.exprs import Exprs
from fuzzing.mutations import FUNCS
from support import ROOT

from shapescript.check.calls import BUILTIN_NAMES, RULES
from shapescript.devices import DeviceSet
from shapescript.errors import CompileError
from shapescript.inits import INITS
from shapescript.ops import OPS, Across
from shapescript.pipeline import check_source
from shapescript.plan.comms import device_table
from shapescript.shapes.plans import Combine

# Every module of shapescript/ outside the op table, and the strings it may hold that are spelled
# as an op's name: none, unless it is there for a reason that isn't a decision about an op.
SPELLED_AS_AN_OP = {
    "shapescript/check/checker.py": {"split"},  # `split H` on a devices line
    "shapescript/check/types.py": {"std"},  # normal(std=)
    "shapescript/plan/records.py": {"split"},  # a value's layout: "split" or "whole"
    "shapescript/plan/comms_text.py": {"split"},
    "shapescript/check/constants.py": {"exp", "log", "sqrt"},  # an initializer's arithmetic
    "shapescript/shapes/options.py": {"min", "max"},  # clamp's bounds, min= and max=
    "shapescript/shapes/plans.py": {"gather", "sum"},  # HeadsKind's words for what split H does with a value
    "shapescript/syntax/tree.py": {"split"},  # the devices line's option
    "shapescript/syntax/parser.py": {"einsum", "split"},  # einsum's pattern has commas; `split H`
    "shapescript/syntax/device_line.py": {"split"},  # the devices line's option `split H`
    # Fusion's rewrites are of these ops' spans: a span of them is what torch has one kernel for.
    "shapescript/ir/fuse.py": {"causal", "einsum", "layer_norm", "masked_fill", "softmax"},
    "shapescript/inits.py": {"mean", "std"},  # normal(mean=, std=)
}
# The run time implements the ops, and the package exports them to Python: their names are its own.
IMPLEMENTATION = ("shapescript/runtime/", "shapescript/parallel/", "shapescript/sinks.py",
                  "shapescript/__init__.py", "shapescript/api.py", "shapescript/background.py")
MODULES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "shapescript").rglob("*.py")
                 if p.parent.name != "ops" and not str(p.relative_to(ROOT)).startswith(IMPLEMENTATION))

# value_and_grad's all-reduce sends the gradients of every param, one all-reduce per dtype, which
# comms.py's `gradients` counts (a payload is one dtype's values).
SENDS_COUNTED_BY_COMMS = {"value_and_grad"}

# With `shard params`, a norm of gradients adds up every device's pieces' squares (one number).
SENDS_WITH_PIECES = {"norm", "clip_norm"}

# Ops whose result a device can't compute from its part of H alone, however called: their split
# operands must be gathered (no `heads` rule), as an extern fn's are.
NEVER_LOCAL_ALONG_H = {"cross_entropy", "dropout", "batch_norm", "embedding", "one_hot", "split", "repeat"}


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_has_a_rule_a_lowering_and_an_entry_for_the_batch_axis(name: str) -> None:
    op = OPS[name]
    assert op.name == name and name in BUILTIN_NAMES and RULES[name] is not None
    assert callable(op.rule) and callable(op.lower) and isinstance(op.across, Across)
    assert 0 <= op.required <= len(op.params) and len(set(op.params)) == len(op.params)
    # Only a rule that places its own arguments takes any number of them (print) or none (Eval).
    assert op.required >= 1 or op.own_args
    if op.across.over_batch is None:  # works on each example alone: nothing to combine, nothing refused
        assert op.across.kind is None and op.across.lower is None and op.across.payload is None
    elif op.across.refused:
        assert op.across.lower is None and op.across.payload is None
    elif name in SENDS_COUNTED_BY_COMMS:
        assert op.across.lower is not None and op.across.payload is None
    else:  # combined: the DeviceTable must be able to say what it sends
        assert op.across.payload is not None
    if isinstance(op.across.kind, Combine):  # an all-reduce of the result, or the op's own lowering
        assert (op.across.kind == Combine.OWN) == (op.across.lower is not None)
    elif op.across.kind is not None:  # decided per call (reduce: with sum, partial sums)
        assert op.across.lower is None
    # Its layout rule: what it sends when the params are in pieces (norms of gradients only), and how
    # it works on values split along H (none: it takes them whole, which is always right).
    assert (op.layout is not None and op.layout.sharded is not None) == (name in SENDS_WITH_PIECES)
    if op.layout is not None and op.layout.heads is not None:
        assert name not in NEVER_LOCAL_ALONG_H


@pytest.mark.parametrize("module", MODULES)
def test_no_stage_names_an_op_of_the_table(module: str) -> None:
    """Placement, the batch split, the DeviceTable, deferring, lowering: each reads what it needs of
    an op from the op's entry (its flags, its rules), and names none."""
    text = (ROOT / module).read_text()
    # A string of the op's name, with the same quote on either side (not `"""value_and_grad's`).
    named = {name for name in OPS if re.search(rf"([\"']){re.escape(name)}\1", text)}
    allowed = SPELLED_AS_AN_OP.get(module, set())
    assert named <= allowed, f"{module} names {sorted(named - allowed)}: read the op table instead"


def test_the_list_of_modules_that_may_spell_an_op_is_up_to_date() -> None:
    assert set(SPELLED_AS_AN_OP) <= set(MODULES) and len(MODULES) > 60


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_is_in_the_standard_librarys_docs(name: str) -> None:
    """In the library's docs, or called in the language's section on the controller (its loops,
    logs and checkpoints)."""
    stdlib = (ROOT / "docs" / "stdlib.md").read_text()
    controller = (ROOT / "docs" / "language.md").read_text().split("## The controller", 1)[1].split("\n## ", 1)[0]
    assert re.search(rf"`[^`\n]*\b{name}\b[^`\n]*`", stdlib) or re.search(rf"\b{name}\(", controller), name


BATCH = "dim C = 4\n\ndata Ex:\n    x: [C]\n    y: [] Index[C]\n\n"


@pytest.mark.parametrize("call, sends", [
    ("sum(batch.x)", ("`sum`'s partial sums", 1)),  # one value: the sum of a device's part
    ("mean(batch.x)", ("`mean`'s sum and count", 2)),  # its sum and its count
    ("cross_entropy(batch.x, batch.y, over=C)", ("cross_entropy's sum and count", 2)),
    ("max(batch.x)", None), ("sum(softmax(batch.x, over=b))", None), ("sum(sort(batch.x, over=b))", None),
])
def test_the_tables_entry_decides_across_the_batch_axis(call: str, sends: tuple[str, int] | None) -> None:
    """On two devices an op over the batch axis is combined (the DeviceTable lists what one
    device sends, counted here by hand) or refused with E1801, as its entry says."""
    source = BATCH + f"fn f(batch: [b] Ex) -> [] = {call}\n"
    devices = DeviceSet("cpu", (0, 1))
    if sends is None:
        with pytest.raises(CompileError) as info:
            check_source(source, "t.ss", devices)
        assert info.value.codes == ["E1801"]
        return
    table = device_table(check_source(source, "t.ss", devices))
    sent = [item.collective for items in table.lines.values() for item in items if item.collective]
    assert len(sent) == 1 and sent[0].what.startswith(sends[0]) and int(sent[0].count) == sends[1]


@pytest.mark.parametrize("call", ["relu(mut x)", "sum(mut x, over=n)", "rearrange(mut x, n -> n)",
                                  "masked_fill(x, mut m, 0.0)"])
def test_mut_on_an_argument_of_an_op_is_refused(call: str) -> None:
    """No op of the table changes its arguments (update and load check `mut` themselves)."""
    source = f"fn f(x: [n], m: [n] bool) -> [n] = {call}\n".replace("-> [n] = sum", "-> [] = sum")
    with pytest.raises(CompileError) as info:
        check_source(source, "mut.ss")
    assert info.value.codes == ["E0503"]
    assert "doesn't change" in info.value.diagnostics[0].message


def test_every_run_time_name_a_module_prints_exists() -> None:
    """Lowerings print calls of the run time by name, some built from strings (`_rt.masked_{name}`):
    each `_rt.NAME` in the modules of the examples, the tests' programs and 80 grammar programs,
    on one device and on two, is a function of runtime/core.py."""
    import warnings

    import programs as P
    from fuzzing.grammar import ProgramGen
    from fuzzing.rand import RandomRand

    from shapescript.lower.targets import Target
    from shapescript.pipeline import compile_program, python_module, python_modules
    from shapescript.runtime import core

    sources = [path.read_text() for path in sorted((ROOT / "examples").rglob("*.ss"))]
    sources += [v for k, v in sorted(vars(P).items()) if k.isupper() and isinstance(v, str) and "fn " in v]
    sources += [ProgramGen(RandomRand(seed), mistakes=0.0).program() for seed in range(80)]
    printed: set[str] = set()
    modules = 0
    for source in sources:
        for devices in ("cpu", "cpu[0 1]"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    unsized = {"V": 11} if re.search(r"^dim V\s*$", source, re.M) else None  # a corpus's size
                    checked = compile_program(source, "names.ss", devices, unsized)
                    texts = (python_modules(checked, (Target.CONTROLLER, Target.WORKER)) if devices != "cpu"
                             else [python_module(checked), python_module(checked, check_types=True)])
                except CompileError:
                    continue
            modules += len(texts)
            printed |= {name for text in texts for name in re.findall(r"\b_rt\.([A-Za-z_]\w*)", text)}
    assert modules > 300 and len(printed) > 30, (modules, len(printed))
    missing = sorted(name for name in printed if not hasattr(core, name))
    assert not missing, f"printed but not in the run time: {missing}"


def test_the_fuzzers_ops_are_the_tables_and_type_as_it_assumes() -> None:
    """The fuzzer draws its unary functions and reductions from the table (tests/fuzzing/exprs.py):
    each types as the fuzzer's programs assume, checked here by the checker itself (a unary function
    keeps a float tensor's type; a reduction drops the axis `over=` names, or gives a [] without it,
    in the operand's dtype); each name it calls or mutates to is an op, a built-in or an initializer."""
    assert "relu" in Exprs.UNARY and "sum" in Exprs.REDUCE and "argmax" not in Exprs.REDUCE
    header = "dim B = 3\ndim D = 4\n"  # each body is checked against its declared type: E0301 if not
    for name in Exprs.UNARY:
        check_source(header + f"fn f(x: [B D] f64) -> [B D] f64 = {name}(x)\n")
    for name in Exprs.REDUCE:
        check_source(header + f"fn f(x: [B D] f64) -> [B] f64 = {name}(x, over=D)\n"
                     f"fn g(x: [B D] f64) -> [] f64 = {name}(x)\n")
    assert set(FUNCS) <= set(OPS) | set(BUILTIN_NAMES) | set(INITS)  # an initializer is a model member's

