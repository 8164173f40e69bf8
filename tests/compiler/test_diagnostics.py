"""Diagnostics that say what to do: each points at the right place and its help names the
fix the user has to make, never the opposite one."""

from __future__ import annotations

import pytest
import torch

from shapescript.codes import CODES
from shapescript.errors import CompileError, Diagnostic, ShapeError, Span
from shapescript.pipeline import check_source
from shapescript.runtime.data import DataSpec, FieldSpec, batch_from_python, check_item


def diagnostics(source: str) -> list[Diagnostic]:
    with pytest.raises(CompileError) as info:
        check_source(source, "t.ss")
    return info.value.diagnostics


def only(source: str, code: str, line: int, col: int) -> Diagnostic:
    """The one diagnostic `source` gets: its code and where it points."""
    ds = diagnostics(source)
    assert [(d.code, d.line, d.column) for d in ds] == [(code, line, col)], "\n".join(d.render(source) for d in ds)
    return ds[0]


MODEL = "dim D = 4\n\nmodel M:\n    param w: [D] = zeros()\n\nfn loss(m: M, x: [b D]) -> [] = mean(x @ m.w)\n\n"


def test_missing_mut_in_a_signature_gets_one_consistent_fix() -> None:
    # `step` changes `m` without declaring it `mut`; its caller rightly passes `mut m`. The caller
    # must not be told to remove `mut`: the fix is adding it to `step`'s parameter.
    source = (MODEL + "fn step(m: M, mut opt: Sgd[M], x: [b D]) -> []:\n"
              "    l, g = value_and_grad(loss, m, x)\n    update(mut m, mut opt, g)\n    return l\n\n"
              "fn outer(mut m: M, mut opt: Sgd[M], x: [b D]) -> [] = step(mut m, mut opt, x)\n")
    d = only(source, "E0501", 10, 12)
    assert d.help == ("declare it `mut m` in `step`'s parameters",)


def test_mut_on_an_argument_nothing_changes_is_still_refused() -> None:
    d = only(MODEL + "fn f(mut m: M, x: [b D]) -> [] = loss(mut m, x)\n", "E0503", 8, 39)
    assert d.help == ("remove `mut`",)


DEVICE_PROGRAM = CODES["E1803"].example.split("fn fit")[0]
STEP = ("fn train_step(mut m: M, mut opt: AdamW[M], batch: [b] Ex) -> []:\n"
        "    l, g = value_and_grad(loss, m, batch)\n    update(mut m, mut opt, g)\n    {call}\n    return l\n")


@pytest.mark.parametrize("extra, call, thing", [
    ("", "print(l)", "`print`"),
    ("fn show(x: []):\n    print(x)\n\n", "show(l)", "the call of `show`"),
], ids=["print", "call-of-a-printing-fn"])
def test_print_in_a_step_points_at_the_print(extra: str, call: str, thing: str) -> None:
    source = DEVICE_PROGRAM + extra + STEP.format(call=call)
    line = source.splitlines().index(f"    {call}") + 1
    d = only(source, "E1803", line, 5)
    assert "run in the controller" in d.label
    assert d.help == (f"move {thing} out of `train_step` into the loop in the controller that calls it; "
                      "`train_step` can return the values it needs",)
    assert d.notes == (f"`value_and_grad` at t.ss:{line - 2}:12 is device work, which runs on the workers",
                       f"`update` at t.ss:{line - 1}:5 is device work, which runs on the workers")


@pytest.mark.parametrize("source, code, line, col, near", [
    # a misspelled dim, in a signature, after `over=` and in a model's fixed shape
    ("dim Hidden = 4\n\nfn f(x: [Hiden]) -> [Hidden] = x\n", "E0201", 3, 10, "Hidden"),
    ("dim Hidden = 4\n\nfn f(x: [b Hidden]) -> [b Hidden] = softmax(x, over=Hiden)\n", "E0303", 3, 53, "Hidden"),
    ("dim K = 4\n\nmodel M:\n    param w: [k] = zeros()\n", "E0312", 4, 15, "K"),
    # `k` for `K`: in a signature a lower-case name is a new generic dim, so the typo shows as a mismatch
    ("dim K = 4\n\nfn f(x: [k]) -> [K] = x\n", "E0305", 3, 23, "K"),
    ("dim K = 4\n\nfn g(x: [K]) -> [K] = x\n\nfn f(x: [k]) -> [k] = g(x)\n", "E0301", 5, 25, "K"),
    ("dim K = 4\n\nfn f(x: [K]) -> [k] = x\n", "E0311", 3, 17, "K"),
    # names, functions, fields and members that differ only by case
    ("fn f(x: []) -> [] = X * 2.0\n", "E0201", 1, 21, "x"),
    ("fn g(x: []) -> [] = x\n\nfn f(x: []) -> [] = G(x)\n", "E0201", 3, 21, "g"),
    ("dim D = 4\n\ndata Ex:\n    x: [D]\n\nfn f(b: [n] Ex) -> [n D] = b.X\n", "E0203", 6, 30, "x"),
    ("dim D = 4\n\nmodel M:\n    param w: [D] = zeros()\n\nfn f(m: M) -> [D] = m.W\n", "E0203", 6, 23, "w"),
], ids=["dim", "dim-over", "dim-fixed-shape", "k-for-K-return", "k-for-K-argument", "k-for-K-result",
        "name-case", "fn-case", "field-case", "member-case"])
def test_did_you_mean(source: str, code: str, line: int, col: int, near: str) -> None:
    d = only(source, code, line, col)
    assert any(f"did you mean `{near}`?" in h for h in d.help), d.render(source)


def test_a_far_name_gets_no_guess() -> None:
    d = only("dim Hidden = 4\n\nfn f(x: [Vocab]) -> [Hidden] = x * 0.0\n", "E0201", 3, 10)
    assert not any("did you mean" in h for h in d.help) and "declare it with `dim Vocab = ...`" in d.help[0]


@pytest.mark.parametrize("source, line, col, cast", [
    ("fn f(x: [n] f32, y: [n] f64) -> [n] f32 = x + y\n", 1, 43, "`to(y, f32)`"),
    ("fn f(x: [n]) -> [] = mean(x > 0.0)\n", 1, 27, "`to(x > 0.0, f32)`"),
], ids=["binary-op", "mean-of-bool"])
def test_dtype_errors_offer_the_cast(source: str, line: int, col: int, cast: str) -> None:
    d = only(source, "E0308", line, col)
    assert any(cast in h for h in d.help), d.render(source)
    # the suggested cast is itself a program the checker accepts
    fixed = source.replace("x + y", "x + to(y, f32)").replace("mean(x > 0.0)", "mean(to(x > 0.0, f32))")
    check_source(fixed, "t.ss")


DIGIT = DataSpec("Digit", (
    FieldSpec("img", (("D", 4),), torch.float32, None, None, "digits.ss:7:5", "[D]"),
    FieldSpec("label", (), torch.int64, 10, "C", "digits.ss:8:5", "[] Index[C]"),
), "digits.ss:6:1")


def test_misspelled_batch_field_is_named() -> None:
    with pytest.raises(ShapeError, match=r"has no field `label` .*; it has `lable`, which Digit does not "
                                         r"declare: did you mean `label`\?$"):
        batch_from_python(DIGIT, {"img": torch.zeros(3, 4), "lable": torch.zeros(3, dtype=torch.int64)},
                          "train.ss:14:20")
    with pytest.raises(ShapeError, match=r"^item 2 of the dataset has no field `label` .*did you mean `label`\?$"):
        check_item(DIGIT, {"img": torch.zeros(4), "Label": 1}, 2)


# ---- secondary labels: where a dim was bound, rustc's `-` underlines ---------------------------

def test_render_draws_secondary_labels_in_line_order() -> None:
    source = "dim D = 4\nfn f(x: [n D]) -> [n] = g(x, y)\n"
    primary = Span("t.ss", 2, 31, 2, 32)
    secondary = ((Span("t.ss", 2, 28, 2, 29), "`n` is 3 here"),  # left of the primary, same line
                 (Span("t.ss", 1, 5, 1, 6), "declared here"),  # an earlier line
                 (Span("u.ss", 4, 2, 4, 3), "in another file"))  # no line of this source to show
    d = Diagnostic("E0306", "a message", primary, "this is [E]", ("do this",), (), secondary)
    assert d.render(source) == "\n".join([
        "error[E0306]: a message",
        "  --> t.ss:2:31",
        "  |",
        "1 | dim D = 4",
        "  |     - declared here",
        "2 | fn f(x: [n D]) -> [n] = g(x, y)",
        "  |                            -  ^ this is [E]",
        "  |                            |",
        "  |                            `n` is 3 here",
        "  = note: u.ss:4:2: in another file",
        "  = help: do this",
    ])
    # Lines between two annotated ones are skipped with `...`; a wide line number widens the gutter.
    far = "\n".join(f"line {k}" for k in range(1, 11)) + "\n"
    d = Diagnostic("E0301", "m", Span("t.ss", 10, 1, 10, 5), "here", (), (),
                   ((Span("t.ss", 8, 6, 8, 7), "there"),))
    assert d.render(far).splitlines()[2:] == ["   |", "8  | line 8", "   |      - there", "...",
                                              "10 | line 10", "   | ^^^^ here"]


def position(source: str, needle: str, after: str = "") -> tuple[int, int]:
    """The 1-based (line, column) of `needle`'s first occurrence after the text `after`."""
    start = source.index(needle, source.index(after) + len(after) if after else 0)
    before = source[:start]
    return before.count("\n") + 1, start - (before.rfind("\n") + 1) + 1


def secondary_at(d: Diagnostic) -> dict[tuple[int, int], str]:
    return {(s.line, s.col): text for s, text in d.secondary}


def test_a_generic_dim_bound_by_an_earlier_argument_is_pointed_at() -> None:
    source = "dim D = 4\ndim E = 4\n\nfn add(x: [n], y: [n]) -> [n] = x + y\n\nfn f(a: [D], b: [E]) -> [D] = add(a, b)\n"
    d = only(source, "E0306", *position(source, "b)", "add("))
    assert secondary_at(d) == {position(source, "a,", "add("): "`n` is D here"}


def test_a_parameter_declared_elsewhere_is_pointed_at() -> None:
    source = "dim D = 4\ndim H = 8\n\nfn g(x: [n H]) -> [n] = sum(x, over=H)\n\nfn f(x: [n D]) -> [n] = g(x)\n"
    d = only(source, "E0301", *position(source, "x)", "= g("))
    assert d.label == "dim 1 is D, not H"
    assert secondary_at(d) == {position(source, "H]", "fn g("): "`x`'s dim 1 is declared H here"}


def test_matmul_points_at_both_operands_declared_axes_and_follows_them_through_operations() -> None:
    source = ("dim D = 4\ndim H = 8\n\nmodel M:\n    param w: [D H] = zeros()\n\n"
              "fn f(m: M, x: [n D]) -> [n H] = relu(x @ m.w) @ m.w\n")
    d = only(source, "E0304", *position(source, "relu("))
    member = position(source, "[D H]")
    assert secondary_at(d) == {(member[0], member[1] + 3): "`m.w`'s last axis is H here",
                               (member[0], member[1] + 1): "`m.w`'s first axis is D here"}


def test_matmul_of_a_local_points_at_its_assignment() -> None:
    source = ("dim D = 4\ndim H = 8\n\nfn f(x: [n D], w: [H D]) -> [n D]:\n    h = x * 2.0\n    return h @ w\n")
    d = only(source, "E0304", *position(source, "h @ w"))
    assert secondary_at(d) == {position(source, "h = "): "`h` is [n D] from here",
                               position(source, "H D]"): "`w`'s first axis is H here"}


def test_a_wrong_result_points_at_the_declared_result_type() -> None:
    source = "dim D = 4\n\nfn f(x: [n D]) -> [n] = x * 2\n"
    d = only(source, "E0305", *position(source, "x * 2"))
    assert secondary_at(d) == {position(source, "[n]"): "the result is declared [n] here"}
    rendered = d.render(source).splitlines()
    assert rendered[4:7] == ["  |                   ---   ^^^^^ 2 axes, not 1", "  |                   |",
                             "  |                   the result is declared [n] here"]


def test_every_secondary_label_is_shown_once_wherever_it_points() -> None:
    # Any place in the source, before, on or after the primary's line, overlapping it or not: the
    # label is printed once, under its own line's text, and the primary's label too.
    source = "ab cd\n\tef gh\nij kl mn\n"
    primary = Span("t.ss", 2, 2, 2, 4)
    for line in range(1, 5):
        for col in range(1, 10):
            d = Diagnostic("E0301", "m", primary, "PRIMARY", (), (),
                           ((Span("t.ss", line, col, line, col + 2), "SECOND"),))
            text = d.render(source)
            assert text.count("SECOND") == 1 and text.count("PRIMARY") == 1, text
            shown = line <= 3
            assert (f"{line} | " in text) == shown and ("= note: t.ss:" in text) != shown, text
