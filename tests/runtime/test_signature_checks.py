"""A function called from Python takes a short way through its argument checks where every argument
is right as it is (runtime/guards.py's `signature_check`, made at the function's first call; issue
15). It must be exactly as strict as the full check: for every call here, right or wrong, the values
the function gets (or the error, class and words) are what the guards alone give with no short way at
all (the reference)."""

from __future__ import annotations

import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from programs import LIN_HEADER

import shapescript as ss
from shapescript.runtime import data, guards
from shapescript.runtime.data import Batch, in_bounds

SOURCE = LIN_HEADER + textwrap.dedent("""\

    data Line:
        tokens: [n] Index[C]

    fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(batch.x @ m.w, batch.y, over=C)

    fn mix(m: Lin, opt: AdamW[Lin], batch: [b] Ex, x: [b D], y: [b] Index[C], w: [D C] f64, s: [], k: int,
           scale: float) -> []:
        return cross_entropy(x @ m.w, y, over=C) + loss(m, batch) * scale + s

    fn square(a: [n n], batch: [6] Ex) -> [] = sum(a)

    fn flat(x: [b*D]) -> [] = sum(x)

    fn lines(batch: [b] Line) -> [] = 0.0

    fn zero() -> [] = 0.0
    """)


@pytest.fixture(scope="module")
def prog() -> Any:
    return ss.load(SOURCE, name="sig.ss")


@pytest.fixture(scope="module")
def others() -> dict[str, Any]:
    """Models and optimizers the program didn't make: of the same shapes (another load), of other
    shapes (D = 5: stale), and of another model type."""
    same = ss.load(SOURCE, name="sig.ss")
    with pytest.warns(UserWarning, match="D = 5"):  # the dims replace the program's, which load() says
        stale = ss.load(SOURCE, name="sig.ss", dims={"D": 5})
    other = ss.load(SOURCE.replace("Lin", "Lin2"), name="other.ss")
    twin, old, stranger = same.Lin.init(seed=1), stale.Lin.init(seed=1), other.Lin2.init(seed=1)
    return {"twin": twin, "old": old, "stranger": stranger, "old opt": ss.adamw(old), "twin opt": ss.adamw(twin)}


@contextmanager
def full_check_only(fn: Any) -> Iterator[None]:
    """The reference: the function's guards alone, without the function's short way nor the batch
    guards' own (`as_given`)."""
    quick, as_given = fn._quick, data.as_given
    fn._quick = None
    data.as_given = guards.as_given = lambda *args: None
    try:
        yield
    finally:
        fn._quick = quick
        data.as_given = guards.as_given = as_given


def described(value: Any, args: tuple) -> Any:
    """A checked value in terms both ways can be compared by: the argument it is, or its contents."""
    for k, arg in enumerate(args):
        if value is arg:
            return ("argument", k)
    if isinstance(value, Batch):
        fields = {f.name: described(getattr(value, f.name), args) for f in value.spec.fields}
        return ("batch", value.spec.name, value.size, fields, value.lengths)
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.tolist())
    return ("other", type(value).__name__, value)


def outcome(fn: Any, args: tuple) -> tuple[str, Any]:
    try:
        checked = fn._checked_args(args, {})
    except Exception as e:
        return type(e).__name__, str(e)
    assert len(checked) == len(args)
    return "ok", [described(v, args) for v in checked]


def both_ways(fn: Any, args: tuple) -> tuple[tuple[str, Any], tuple[str, Any]]:
    short = outcome(fn, args)
    with full_check_only(fn):
        full = outcome(fn, args)
    return short, full


# -- what a call of `mix` gets, drawn argument by argument ------------------------------------------

Make = Callable[[Any, dict[str, Any], int, torch.Generator], Any]  # (program, others, rows, generator)


def labels(values: list[int]) -> Make:
    return lambda p, o, b, g: torch.tensor((values * b)[:b], dtype=torch.int64)


def images(b: int, g: torch.Generator, width: int = 4, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(b, width, generator=g).to(dtype)


RIGHT_LABELS = labels([0, 1, 2, 2, 1])
MODELS: dict[str, Make] = {
    "right": lambda p, o, b, g: p._m,
    "a twin of the same shapes": lambda p, o, b, g: o["twin"],
    "stale (D = 5)": lambda p, o, b, g: o["old"],
    "another model type": lambda p, o, b, g: o["stranger"],
    "a tensor": lambda p, o, b, g: torch.zeros(4, 3),
    "None": lambda p, o, b, g: None,
}
OPTIMIZERS: dict[str, Make] = {
    "right": lambda p, o, b, g: p._opt,
    "an SGD": lambda p, o, b, g: p._sgd,
    "of a twin": lambda p, o, b, g: o["twin opt"],
    "of a stale model": lambda p, o, b, g: o["old opt"],
    "the model": lambda p, o, b, g: p._m,
}
BATCHES: dict[str, Make] = {
    "right": lambda p, o, b, g: {"x": images(b, g), "y": RIGHT_LABELS(p, o, b, g)},
    "fields in another order": lambda p, o, b, g: {"y": RIGHT_LABELS(p, o, b, g), "x": images(b, g)},
    "a Batch": lambda p, o, b, g: Batch(p.Ex, {"x": images(b, g), "y": RIGHT_LABELS(p, o, b, g)}),
    "a Batch of another type": lambda p, o, b, g: Batch(p.Line, {"tokens": torch.zeros(b, 2, dtype=torch.int64)}),
    "label -100": lambda p, o, b, g: {"x": images(b, g), "y": labels([0, -100])(p, o, b, g)},
    "label -1": lambda p, o, b, g: {"x": images(b, g), "y": labels([2, -1])(p, o, b, g)},
    "label C": lambda p, o, b, g: {"x": images(b, g), "y": labels([1, 3])(p, o, b, g)},
    "int32 labels": lambda p, o, b, g: {"x": images(b, g), "y": RIGHT_LABELS(p, o, b, g).int()},
    "float labels": lambda p, o, b, g: {"x": images(b, g), "y": RIGHT_LABELS(p, o, b, g).float()},
    "f64 images": lambda p, o, b, g: {"x": images(b, g, dtype=torch.float64), "y": RIGHT_LABELS(p, o, b, g)},
    "images too wide": lambda p, o, b, g: {"x": images(b, g, width=5), "y": RIGHT_LABELS(p, o, b, g)},
    "a row short": lambda p, o, b, g: {"x": images(b + 1, g), "y": RIGHT_LABELS(p, o, b, g)},
    "no rows": lambda p, o, b, g: {"x": images(0, g), "y": RIGHT_LABELS(p, o, 0, g)},
    "no field y": lambda p, o, b, g: {"x": images(b, g)},
    "a field `yy` for y": lambda p, o, b, g: {"x": images(b, g), "yy": RIGHT_LABELS(p, o, b, g)},
    "a field too many": lambda p, o, b, g: {"x": images(b, g), "y": RIGHT_LABELS(p, o, b, g), "z": images(b, g)},
    "numpy images": lambda p, o, b, g: {"x": images(b, g).numpy(), "y": RIGHT_LABELS(p, o, b, g)},
    "lists": lambda p, o, b, g: {"x": images(b, g).tolist(), "y": RIGHT_LABELS(p, o, b, g).tolist()},
    "non-contiguous images": lambda p, o, b, g: {"x": torch.randn(4, b, generator=g).t(), "y": RIGHT_LABELS(p, o, b, g)},
    "meta images": lambda p, o, b, g: {"x": torch.empty(b, 4, device="meta"), "y": RIGHT_LABELS(p, o, b, g)},
    "sparse images": lambda p, o, b, g: {"x": images(b, g).to_sparse(), "y": RIGHT_LABELS(p, o, b, g)},
    "a Parameter": lambda p, o, b, g: {"x": torch.nn.Parameter(images(b, g)), "y": RIGHT_LABELS(p, o, b, g)},
    "a scalar label": lambda p, o, b, g: {"x": images(b, g), "y": torch.tensor(1)},
    "a list of tensors": lambda p, o, b, g: [images(b, g), RIGHT_LABELS(p, o, b, g)],
}
XS: dict[str, Make] = {
    "right": lambda p, o, b, g: images(b, g),
    "a row more": lambda p, o, b, g: images(b + 1, g),
    "too wide": lambda p, o, b, g: images(b, g, width=5),
    "f64": lambda p, o, b, g: images(b, g, dtype=torch.float64),
    "non-contiguous": lambda p, o, b, g: torch.randn(4, b, generator=g).t(),
    "one axis": lambda p, o, b, g: torch.randn(4 * b, generator=g),
    "numpy": lambda p, o, b, g: images(b, g).numpy(),
    "a float": lambda p, o, b, g: 1.5,
    "meta": lambda p, o, b, g: torch.empty(b, 4, device="meta"),
    "a Parameter": lambda p, o, b, g: torch.nn.Parameter(images(b, g)),
}
YS: dict[str, Make] = {
    "right": RIGHT_LABELS,
    "-100": labels([1, -100]),
    "-1": labels([-1, 0]),
    "C": labels([3]),
    "huge": labels([0, 2**40]),
    "int32": lambda p, o, b, g: RIGHT_LABELS(p, o, b, g).int(),
    "a row less": lambda p, o, b, g: RIGHT_LABELS(p, o, max(b - 1, 0), g),
    "a column": lambda p, o, b, g: RIGHT_LABELS(p, o, b, g)[:, None],
    "strided": lambda p, o, b, g: RIGHT_LABELS(p, o, 2 * b, g)[::2],
    "a list": lambda p, o, b, g: RIGHT_LABELS(p, o, b, g).tolist(),
}
WS: dict[str, Make] = {
    "right": lambda p, o, b, g: torch.randn(4, 3, generator=g, dtype=torch.float64),
    "f32": lambda p, o, b, g: torch.randn(4, 3, generator=g),
    "transposed": lambda p, o, b, g: torch.randn(3, 4, generator=g, dtype=torch.float64),
}
SS: dict[str, Make] = {
    "right": lambda p, o, b, g: torch.tensor(0.5),
    "a float": lambda p, o, b, g: 0.5,
    "an int": lambda p, o, b, g: 2,
    "a bool": lambda p, o, b, g: True,
    "one axis": lambda p, o, b, g: torch.tensor([0.5]),
    "f64": lambda p, o, b, g: torch.tensor(0.5, dtype=torch.float64),
}
KS: dict[str, Make] = {
    "right": lambda p, o, b, g: 3, "a bool": lambda p, o, b, g: False, "a float": lambda p, o, b, g: 3.0,
    "numpy int": lambda p, o, b, g: np.int64(3), "a str": lambda p, o, b, g: "3",
}
SCALES: dict[str, Make] = {
    "right": lambda p, o, b, g: 0.5, "an int": lambda p, o, b, g: 1, "a bool": lambda p, o, b, g: True,
    "a tensor": lambda p, o, b, g: torch.tensor(0.5), "None": lambda p, o, b, g: None,
}
PARAMS = (MODELS, OPTIMIZERS, BATCHES, XS, YS, WS, SS, KS, SCALES)
# What the full check takes of the wrong-looking arguments above (converting some), by parameter.
ACCEPTED = {0: ("a twin of the same shapes",), 1: ("of a twin",), 2: ("fields in another order", "a Batch",
            "int32 labels", "numpy images", "lists", "non-contiguous images", "a Parameter"),
            3: ("non-contiguous", "a Parameter"), 4: ("strided",), 5: (), 6: ("a float", "an int"),
            7: ("numpy int",), 8: ("an int",)}


def with_handles(prog: Any) -> Any:
    """The program's own model and optimizers, made once."""
    if not hasattr(prog, "_m"):
        prog._m = prog.Lin.init(seed=0)
        prog._opt, prog._sgd = ss.adamw(prog._m), ss.sgd(prog._m)
        prog.Ex, prog.Line = prog.namespace["Ex_spec"], prog.namespace["Line_spec"]
    return prog


def right_choice(options: dict[str, Make]) -> st.SearchStrategy[str]:
    """Mostly the right argument, so that a drawn call has few wrong ones (each alone must be caught)."""
    return st.one_of(st.just("right"), st.just("right"), st.sampled_from(list(options)))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)  # the same draws each run
@given(choices=st.tuples(*(right_choice(p) for p in PARAMS)), rows=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_every_call_of_mix_gets_what_the_full_check_gives(prog: Any, others: dict[str, Any],
                                                          choices: tuple[str, ...], rows: int, seed: int) -> None:
    p = with_handles(prog)
    g = torch.Generator().manual_seed(seed)
    args = tuple(options[choice](p, others, rows, g) for options, choice in zip(PARAMS, choices))
    short, full = both_ways(p.mix, args)
    assert short == full, choices


def assert_wrong_argument_alone(prog: Any, others: dict[str, Any], param: int, choice: str) -> None:
    p = with_handles(prog)
    g = torch.Generator().manual_seed(param)
    args = tuple(options[choice if k == param else "right"](p, others, 5, g) for k, options in enumerate(PARAMS))
    short, full = both_ways(p.mix, args)
    assert short == full
    assert (short[0] == "ok") == (choice in ACCEPTED.get(param, ()) or choice == "right")


def right_mix_args(p: Any, g: torch.Generator, batch: Any) -> tuple:
    return (p._m, p._opt, batch, images(6, g), RIGHT_LABELS(p, {}, 6, g), WS["right"](p, {}, 6, g),
            torch.tensor(0.5), 3, 0.5)


def checked_without_guards(fn: Any, args: tuple) -> list[Any]:
    """The arguments as a second call checks them, its guards refusing to run: the short way alone."""
    fn._checked_args(args, {})
    guards_then = fn._guards
    fn._guards = tuple(_refusing for _ in guards_then)
    try:
        return fn._checked_args(args, {})
    finally:
        fn._guards = guards_then


@pytest.mark.parametrize("param, choice", [(k, c) for k, options in enumerate(PARAMS) for c in options])
def test_each_wrong_argument_alone_gets_what_the_full_check_gives(prog: Any, others: dict[str, Any], param: int,
                                                                  choice: str) -> None:
    assert_wrong_argument_alone(prog, others, param, choice)



@pytest.fixture(scope="module")
def prog_on_two() -> Iterator[Any]:
    """The program on cpu[0 1]: its models and optimizers are the workers' handles."""
    fixed = "fn square(a: [n n], batch: [6] Ex) -> [] = sum(a)\n"  # a fixed batch size can't be split: E1802
    assert fixed in SOURCE
    prog = ss.load(SOURCE.replace(fixed, ""), name="sig.ss", devices="cpu[0 1]")
    try:
        yield prog
    finally:
        prog.stop()


@pytest.mark.slow
@pytest.mark.parametrize("param, choice", [(k, c) for k, options in enumerate(PARAMS) for c in options])
def test_on_several_devices_each_wrong_argument_gets_what_the_full_check_gives(prog_on_two: Any, others: dict[str, Any],
                                                                               param: int, choice: str) -> None:
    assert_wrong_argument_alone(prog_on_two, others, param, choice)


@pytest.mark.slow
def test_on_several_devices_right_arguments_and_handles_take_the_short_way(prog_on_two: Any) -> None:
    p = with_handles(prog_on_two)
    g = torch.Generator().manual_seed(0)
    args = right_mix_args(p, g, BATCHES["right"](p, {}, 6, g))
    assert getattr(p._m, "is_remote", False) and getattr(p._opt, "is_remote", False)
    checked = checked_without_guards(p.mix, args)
    assert checked[0] is p._m and checked[1] is p._opt and isinstance(checked[2], Batch)
    one = ss.load(SOURCE, name="sig.ss")  # and the call gives what one device gives, from the same model
    m = one.Lin.init(seed=0)
    assert torch.allclose(p.mix(*args), one.mix(m, ss.adamw(m), *args[2:]), atol=1e-6)


@pytest.mark.parametrize("rows", [2, 5])
@pytest.mark.parametrize("choice", BATCHES)
def test_each_batch_alone_gets_what_the_full_check_gives(prog: Any, choice: str, rows: int) -> None:
    """A function whose only sized argument is the batch (`loss`): nothing else binds its rows."""
    p = with_handles(prog)
    args = (p._m, BATCHES[choice](p, {}, rows, torch.Generator().manual_seed(rows)))
    short, full = both_ways(p.loss, args)
    assert short == full
    assert (short[0] == "ok") == (choice in ACCEPTED[2] or choice == "right")


def test_right_arguments_take_the_short_way_and_come_as_they_are(prog: Any) -> None:
    p = with_handles(prog)
    g = torch.Generator().manual_seed(0)
    batch = BATCHES["right"](p, {}, 6, g)
    args = right_mix_args(p, g, batch)
    checked = checked_without_guards(p.mix, args)
    assert [v is a for v, a in zip(checked, args)] == [True, True, False, True, True, True, True, True, True]
    assert isinstance(checked[2], Batch) and checked[2].size == 6 and checked[2].lengths == {}
    assert checked[2].x is batch["x"] and checked[2].y is batch["y"]
    batch["x"] = images(6, g)  # the caller's dict is not the batch's
    assert checked[2].x is not batch["x"]
    # and the call itself gives what torch gives
    loss = p.loss(p._m, {"x": args[3], "y": args[4]})
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(args[3] @ p._m.w, args[4]))


def _refusing(value: Any, bindings: Any) -> Any:
    raise AssertionError("the full check ran")


def test_a_square_and_a_batch_of_fixed_size(prog: Any) -> None:
    """A generic dim twice in one tensor, and a batch of a fixed size, both ways."""
    p = with_handles(prog)
    g = torch.Generator().manual_seed(3)
    for a in (torch.zeros(3, 3), torch.zeros(3, 4), torch.zeros(0, 0), torch.zeros(3)):
        for b in (6, 5):
            args = (a, BATCHES["right"](p, {}, b, g))
            short, full = both_ways(p.square, args)
            assert short == full
            assert (short[0] == "ok") == (a.dim() == 2 and a.shape[0] == a.shape[1] and b == 6)
    assert p.square._quick is not None


def test_functions_whose_checks_need_more_take_the_full_check(prog: Any) -> None:
    """An axis computed from generic dims, and a batch with a padded generic dim: no short way, and
    the guards say what is wrong as before."""
    p = with_handles(prog)
    for fn, args in ((p.flat, (torch.zeros(8),)), (p.flat, (torch.zeros(7),)),
                     (p.lines, ({"tokens": torch.tensor([[1, 2]])},)), (p.lines, ({"tokens": torch.tensor([[1, 9]])},))):
        short, full = both_ways(fn, args)
        assert short == full
        assert fn._quick is None


def test_a_function_without_parameters(prog: Any) -> None:
    assert float(prog.zero()) == 0.0 and prog.zero._quick is not None
    assert both_ways(prog.zero, ()) == (("ok", []), ("ok", []))


def test_bindings_across_arguments_by_keyword(prog: Any) -> None:
    """Arguments given by keyword are arranged first; a dim bound by the batch and refused in `x`
    names the batch, both ways."""
    p = with_handles(prog)
    g = torch.Generator().manual_seed(4)
    kwargs = dict(m=p._m, opt=p._opt, batch=BATCHES["right"](p, {}, 4, g), x=images(5, g),
                  y=RIGHT_LABELS(p, {}, 4, g), w=WS["right"](p, {}, 4, g), s=torch.tensor(1.0), k=1, scale=1.0)
    with pytest.raises(ss.ShapeError) as fast:
        p.mix(**kwargs)
    with full_check_only(p.mix), pytest.raises(ss.ShapeError) as full:
        p.mix(**kwargs)
    assert str(fast.value) == str(full.value)
    assert "b was bound to 4 by `batch`" in str(fast.value)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(values=st.lists(st.integers(-200, 200), max_size=40), bound=st.integers(1, 150),
       dtype=st.sampled_from([torch.int64, torch.int32]), step=st.integers(1, 3))
def test_index_bounds_are_those_of_a_plain_comparison(values: list[int], bound: int, dtype: torch.dtype,
                                                      step: int) -> None:
    t = torch.tensor(values, dtype=dtype)[::step]
    assert in_bounds(t, bound) == bool(((t >= 0) & (t < bound)).all())


def test_index_bounds_in_threads_and_in_inference_mode() -> None:
    """Each thread compares in numbers of its own: two threads checking at once never see each
    other's; and numbers made in inference mode still serve outside it."""
    good, bad = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 7, 2])
    wrong: list[str] = []

    def check(first: torch.Tensor, second: torch.Tensor) -> None:
        with torch.inference_mode():
            if in_bounds(first, 3) != (first is good):
                wrong.append("inference mode")
        for _ in range(3000):
            for t in (first, second):
                if in_bounds(t, 3) != (t is good):
                    wrong.append("a thread saw another's")
    threads = [threading.Thread(target=check, args=pair) for pair in ((good, bad), (bad, good))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
