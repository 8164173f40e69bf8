"""conv1d, conv2d, max_pool2d and avg_pool2d (ops/convolution.py) against torch in f64, values and
gradients; the output sizes as types (numbers where the sizes are known, dim arithmetic where they
aren't), and a property test over random sizes: the type's size is torch's output size, or the
checker refuses (E0315) exactly where torch raises; the codes of their misuses, and sliding along
the batch axis on several devices (E1801). (tests/several/test_convolution_several.py runs a CNN on
several devices and layouts.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from test_more_ops import DIMS, against_torch, r

import shapescript as ss
from shapescript.errors import CompileError

# (name, the function f, its inputs, the same in torch); DIMS: C = 4, D = 3, V = 5.
CASES = [
    ("conv1d", "fn f(x: [b C n] f64, w: [D C 3] f64) -> [b D n-2] f64 = conv1d(x, w)", (r(2, 4, 7), r(3, 4, 3)),
     lambda x, w: F.conv1d(x, w)),
    ("conv1d-settings", "fn f(x: [b C 9] f64, w: [D C 3] f64) -> [b D 4] f64 = conv1d(x, w, stride=2, padding=1, "
     "dilation=2)", (r(2, 4, 9), r(3, 4, 3)), lambda x, w: F.conv1d(x, w, stride=2, padding=1, dilation=2)),
    ("conv2d", "fn f(x: [b C h w] f64, k: [D C 3 2] f64) -> [b D h-2 w-1] f64 = conv2d(x, k)",
     (r(2, 4, 6, 5), r(3, 4, 3, 2)), lambda x, k: F.conv2d(x, k)),
    ("conv2d-padded", "fn f(x: [b C 5 5] f64, k: [D C 3 3] f64) -> [b D 5 5] f64 = conv2d(x, k, padding=1)",
     (r(2, 4, 5, 5), r(3, 4, 3, 3)), lambda x, k: F.conv2d(x, k, padding=1)),
    ("conv2d-stride", "fn f(x: [b C 8 7] f64, k: [D C 3 3] f64) -> [b D 3 3] f64 = conv2d(x, k, stride=2)",
     (r(2, 4, 8, 7), r(3, 4, 3, 3)), lambda x, k: F.conv2d(x, k, stride=2)),
    ("conv2d-groups", "fn f(x: [b C 5 5] f64, k: [6 2 3 3] f64) -> [b 6 3 3] f64 = conv2d(x, k, groups=2)",
     (r(2, 4, 5, 5), r(6, 2, 3, 3)), lambda x, k: F.conv2d(x, k, groups=2)),
    ("conv2d-bias-and-leading-axes", "fn f(x: [b 2 C 5 5] f64, k: [D C 3 3] f64, bias: [D] f64) -> [b 2 D 3 3] f64"
     " = conv2d(x, k) + bias", (r(3, 2, 4, 5, 5), r(3, 4, 3, 3), r(3)),
     lambda x, k, bias: F.conv2d(x.reshape(6, 4, 5, 5), k, bias).reshape(3, 2, 3, 3, 3)),
    ("conv_transpose2d", "fn f(x: [b C 4 3] f64, k: [C D 3 3] f64) -> [b D 8 6] f64 = conv_transpose2d(x, k, "
     "stride=2, padding=1, output_padding=1)", (r(2, 4, 4, 3), r(4, 3, 3, 3)),
     lambda x, k: F.conv_transpose2d(x, k, stride=2, padding=1, output_padding=1)),
    ("conv_transpose2d-groups", "fn f(x: [b C 3 3] f64, k: [C 3 2 2] f64) -> [b 6 4 4] f64 = conv_transpose2d(x, k, "
     "groups=2)", (r(2, 4, 3, 3), r(4, 3, 2, 2)), lambda x, k: F.conv_transpose2d(x, k, groups=2)),
    ("adaptive_avg_pool2d", "fn f(x: [b C 7 5] f64) -> [b C 3 D] f64 = adaptive_avg_pool2d(x, 3, D)",
     (r(2, 4, 7, 5),), lambda x: F.adaptive_avg_pool2d(x, (3, 3))),
    ("global-pool", "fn f(x: [b C h w] f64) -> [b C 1 1] f64 = adaptive_avg_pool2d(x, 1, 1)", (r(2, 4, 6, 5),),
     lambda x: x.mean((2, 3), keepdim=True)),
    ("adaptive_max_pool2d", "fn f(x: [b C 6 6] f64) -> [b C 4 4] f64 = adaptive_max_pool2d(x, 4, 4)",
     (r(2, 4, 6, 6),), lambda x: F.adaptive_max_pool2d(x, 4)),
    ("max_pool2d", "fn f(x: [b C 6 6] f64) -> [b C 3 3] f64 = max_pool2d(x, 2)", (r(2, 4, 6, 6),),
     lambda x: F.max_pool2d(x, 2)),
    ("max_pool2d-overlapping", "fn f(x: [b C 7 7] f64) -> [b C 3 3] f64 = max_pool2d(x, 3, stride=2)",
     (r(2, 4, 7, 7),), lambda x: F.max_pool2d(x, 3, stride=2)),
    ("avg_pool2d-padded", "fn f(x: [b C 5 5] f64) -> [b C 3 3] f64 = avg_pool2d(x, 3, stride=2, padding=1)",
     (r(2, 4, 5, 5),), lambda x: F.avg_pool2d(x, 3, stride=2, padding=1)),
    ("pool-of-generic-sizes", "fn f(x: [b C h w] f64) -> [b C h-2 w-2] f64 = avg_pool2d(x, 3, stride=1)",
     (r(2, 4, 6, 5),), lambda x: F.avg_pool2d(x, 3, stride=1)),
]


@pytest.mark.parametrize("name, src, inputs, reference", CASES, ids=[c[0] for c in CASES])
def test_against_torch(name: str, src: str, inputs: tuple, reference) -> None:
    against_torch(src, inputs, reference)


def test_generic_sizes_work_on_any_input_the_window_fits() -> None:
    prog = ss.load(DIMS + CASES[2][1] + "\n", name="conv.ss")
    for h, w in ((3, 2), (9, 4)):
        x, k = r(1, 4, h, w), r(3, 4, 3, 2)
        torch.testing.assert_close(prog.f(x, k), F.conv2d(x, k), rtol=0, atol=1e-12)
    strided = "fn f(x: [b C h w] f64, k: [D C 3 3] f64) = conv2d(x, k, stride=2)"
    with pytest.raises(CompileError) as info:  # the type it says: torch's arithmetic, floored
        ss.load(DIMS + strided + "\n", name="conv.ss")
    assert "returns [b D floor(h/2-3/2)+1 floor(w/2-3/2)+1] f64" in str(info.value)


def conv_program(n: int, k: int, stride: int, padding: int, dilation: int) -> str:
    return (f"fn f(x: [b 2 {n}] f64, w: [3 2 {k}] f64) = conv1d(x, w, stride={stride}, padding={padding}, "
            f"dilation={dilation})")


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 12), k=st.integers(1, 6), stride=st.integers(1, 4), padding=st.integers(0, 3),
       dilation=st.integers(1, 3), pool=st.booleans())
def test_the_types_size_is_torchs_or_refused_exactly_where_torch_raises(
        n: int, k: int, stride: int, padding: int, dilation: int, pool: bool) -> None:
    x = torch.zeros(1, 2, n, n if pool else 1, dtype=torch.float64)
    if pool:
        src = f"fn f(x: [b 2 {n} {n}] f64) = max_pool2d(x, {k}, stride={stride}, padding={padding})"
        run = lambda: F.max_pool2d(x, k, stride, padding)  # noqa: E731
    else:
        src = conv_program(n, k, stride, padding, dilation)
        x = x[..., 0]
        run = lambda: F.conv1d(x, torch.zeros(3, 2, k, dtype=torch.float64), stride=stride,  # noqa: E731
                               padding=padding, dilation=dilation)
    try:
        expected = tuple(run().shape)
    except RuntimeError:
        expected = None
    with pytest.raises(CompileError) as info:  # no result declared: the message says the type found
        ss.load(DIMS + src + "\n", name="size.ss")
    codes = info.value.codes
    if expected is None:
        assert codes == ["E0315"], (src, str(info.value))
    else:
        assert codes == ["E0305"], (src, str(info.value))
        sizes = expected[2:]
        assert f"returns [b {'2' if pool else '3'} {' '.join(map(str, sizes))}] f64" in str(info.value), src


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), k=st.integers(1, 4), stride=st.integers(1, 3), padding=st.integers(0, 3),
       extra=st.integers(0, 2), dilation=st.integers(1, 2))
def test_a_transposed_convolutions_size_is_torchs_or_refused_where_torch_raises(
        n: int, k: int, stride: int, padding: int, extra: int, dilation: int) -> None:
    x, w = torch.zeros(1, 2, n, n, dtype=torch.float64), torch.zeros(2, 3, k, k, dtype=torch.float64)
    try:
        expected = tuple(F.conv_transpose2d(x, w, stride=stride, padding=padding, output_padding=extra,
                                            dilation=dilation).shape)
    except RuntimeError:
        expected = None
    src = (f"fn f(x: [b 2 {n} {n}] f64, w: [2 3 {k} {k}] f64) = conv_transpose2d(x, w, stride={stride}, "
           f"padding={padding}, output_padding={extra}, dilation={dilation})")
    with pytest.raises(CompileError) as info:
        ss.load(DIMS + src + "\n", name="size.ss")
    if expected is None:
        assert info.value.codes == ["E0315"], (src, str(info.value))
    else:
        assert info.value.codes == ["E0305"] and f"returns [b 3 {expected[2]} {expected[3]}] f64" in str(info.value), src


@pytest.mark.parametrize("src, code, words", [
    ("fn f(x: [b D 5 5], k: [4 C 3 3]) = conv2d(x, k)", "E0301", "weight takes C channels, and x has D"),
    ("fn f(x: [b C 5 5], k: [5 2 3 3]) = conv2d(x, k, groups=2)", "E0301", "5 output channels don't split"),
    ("fn f(x: [5 5], k: [4 C 3 3]) = conv2d(x, k)", "E0302", "a channel axis and 2 more last"),
    ("fn f(x: [b C 5 5] f64, k: [4 C 3 3]) = conv2d(x, k)", "E0308", "conv2d` of f64 and f32"),
    ("fn f(x: [b C 5 5], k: [4 C 3 3]) = conv2d(x, k, stride=0)", "E0310", "stride is a whole number of at least 1"),
    ("fn f(x: [b C 5 5], k: [4 C 3 3], s: int) = conv2d(x, k, stride=s)", "E0310", "written as a number"),
    ("fn f(x: [b C 5 5]) = max_pool2d(x, 2, padding=2)", "E0315", "at most half"),
    ("fn f(x: [b C 2 2]) = max_pool2d(x, 3)", "E0315", "window of 3 doesn't fit along an axis of 2"),
    ("fn f(x: [b C 5 5] i64) = max_pool2d(x, 2)", "E0308", "float tensors"),
    ("fn f(x: [b C 5 5], k: [D C 3 3]) = conv_transpose2d(x, k, stride=2, output_padding=2)", "E0315",
     "output_padding 2 must be below"),
    ("fn f(x: [b D 5 5], k: [C D 3 3]) = conv_transpose2d(x, k)", "E0301", "weight takes C channels, and x has D"),
    ("fn f(x: [b C h w], n: int) = adaptive_avg_pool2d(x, 2, n)", "E0303", "isn't a dim"),
])
def test_misuses(src: str, code: str, words: str) -> None:
    with pytest.raises(CompileError) as info:
        ss.load(DIMS + src + "\n", name="conv.ss")
    assert any(d.code == code and words in d.message for d in info.value.diagnostics), str(info.value)


def test_sliding_along_the_batch_axis_on_several_devices_is_e1801() -> None:
    src = (DIMS + "data Ex:\n    x: [C]\n\nfn f(batch: [b] Ex, w: [D C 3]) -> [D b-2] = "
           "conv1d(rearrange(batch.x, b c -> c b), w)\n")
    ss.load(src, name="conv.ss")  # one device: fine
    with pytest.raises(CompileError) as info:
        ss.load(src, name="conv.ss", devices="cpu[0 1]")
    assert "E1801" in info.value.codes
