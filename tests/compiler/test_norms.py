"""layer_norm, rms_norm and group_norm, the built-in norms (ops/norms.py), against torch's functional
norms in f64: values, and the gradients of x and of the affine params; over an axis that isn't last;
the codes of their misuses; and what each does on several devices, along the batch axis (E1801) and
under `split H` (each device's own part, or the operands gathered), as the DeviceTable and the
workers' module say. (tests/several/test_norms_several.py runs them on several devices.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import shapescript as ss
from shapescript.errors import CompileError
from shapescript.lower.targets import Target
from shapescript.pipeline import compile_program, python_modules
from shapescript.plan.comms import device_table

DIMS = "dim C = 4\ndim D = 3\ndim G = 2\n"
G = torch.Generator().manual_seed(0)


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=G, dtype=torch.float64)


def moved(norm: Callable[[torch.Tensor], torch.Tensor], axis: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """`norm` of the vectors along `axis`: torch's norms take them last."""
    return lambda x: norm(x.movedim(axis, -1)).movedim(-1, axis)


# (name, f in ShapeScript, its inputs, the same in torch)
CASES = [
    ("layer_norm", "fn f(x: [b n D] f64) -> [b n D] f64 = layer_norm(x, over=D)", (r(2, 5, 3),),
     lambda x: F.layer_norm(x, (3,))),
    ("layer_norm-affine", "fn f(x: [b n D] f64, w: [D] f64, bias: [D] f64) -> [b n D] f64 = layer_norm(x, w, bias, over=D)",
     (r(2, 5, 3), r(3), r(3)), lambda x, w, b: F.layer_norm(x, (3,), w, b)),
    ("layer_norm-keywords-eps", "fn f(x: [b D] f64, w: [D] f64, bias: [D] f64) -> [b D] f64 = "
     "layer_norm(x, over=D, bias=bias, weight=w, eps=0.25)", (r(4, 3), r(3), r(3)),
     lambda x, w, b: F.layer_norm(x, (3,), w, b, eps=0.25)),
    ("layer_norm-weight-only", "fn f(x: [b D] f64, w: [D] f64) -> [b D] f64 = layer_norm(x, w, over=D)",
     (r(4, 3), r(3)), lambda x, w: F.layer_norm(x, (3,), w)),
    ("layer_norm-bias-only", "fn f(x: [b D] f64, bias: [D] f64) -> [b D] f64 = layer_norm(x, bias=bias, over=D)",
     (r(4, 3), r(3)), lambda x, b: F.layer_norm(x, (3,), None, b)),
    ("layer_norm-middle", "fn f(x: [b D n] f64, w: [D] f64, bias: [D] f64) -> [b D n] f64 = layer_norm(x, w, bias, over=D)",
     (r(2, 3, 5), r(3), r(3)), lambda x, w, b: moved(lambda v: F.layer_norm(v, (3,), w, b), 1)(x)),
    ("layer_norm-first", "fn f(x: [D n] f64) -> [D n] f64 = layer_norm(x, over=D)", (r(3, 5),),
     moved(lambda v: F.layer_norm(v, (3,)), 0)),
    ("rms_norm", "fn f(x: [b n D] f64) -> [b n D] f64 = rms_norm(x, over=D)", (r(2, 5, 3),),
     lambda x: F.rms_norm(x, (3,))),  # eps: torch's default, the machine epsilon of f64
    ("rms_norm-weight-eps", "fn f(x: [b D] f64, w: [D] f64) -> [b D] f64 = rms_norm(x, w, over=D, eps=1e-6)",
     (r(4, 3), r(3)), lambda x, w: F.rms_norm(x, (3,), w, eps=1e-6)),
    ("rms_norm-middle", "fn f(x: [b D n] f64, w: [D] f64) -> [b D n] f64 = rms_norm(x, weight=w, over=D)",
     (r(2, 3, 5), r(3)), lambda x, w: moved(lambda v: F.rms_norm(v, (3,), w), 1)(x)),
    ("group_norm", "fn f(x: [b C h w] f64) -> [b C h w] f64 = group_norm(x, 2, over=C)", (r(3, 4, 2, 5),),
     lambda x: F.group_norm(x, 2)),
    ("group_norm-affine", "fn f(x: [b C n] f64, w: [C] f64, bias: [C] f64) -> [b C n] f64 = "
     "group_norm(x, G, w, bias, over=C, eps=0.01)", (r(3, 4, 5), r(4), r(4)),
     lambda x, w, b: F.group_norm(x, 2, w, b, eps=0.01)),
    ("group_norm-leading-axes", "fn f(x: [b 2 C n] f64, w: [C] f64) -> [b 2 C n] f64 = group_norm(x, 4, w, over=C)",
     (r(3, 2, 4, 5), r(4)), lambda x, w: F.group_norm(x.reshape(6, 4, 5), 4, w).reshape(3, 2, 4, 5)),
    ("group_norm-channels-first", "fn f(x: [C n] f64, bias: [C] f64) -> [C n] f64 = group_norm(x, 1, bias=bias, over=C)",
     (r(4, 5), r(4)), lambda x, b: F.group_norm(x[None], 1)[0] + b[:, None]),  # (torch's bias alone has no backward)
    ("group_norm-channels-last", "fn f(x: [b C] f64) -> [b C] f64 = group_norm(x, 2, over=C)", (r(5, 4),),
     lambda x: F.group_norm(x, 2)),
]


@pytest.mark.parametrize("name, src, inputs, reference", CASES, ids=[c[0] for c in CASES])
def test_against_torch(name: str, src: str, inputs: tuple[torch.Tensor, ...], reference) -> None:
    """The value, and the gradients of a random weighting of it with respect to x and the affine
    params, within 1e-10 of torch's; and through the Python API's guards."""
    prog = ss.load(DIMS + src + "\n", name="norms.ss")
    fn = prog.namespace["f"]  # the generated function itself, so that autograd sees through it
    args = [x.clone().requires_grad_() for x in inputs]
    ref_args = [x.detach().clone().requires_grad_() for x in inputs]
    out, expected = fn(*args), reference(*ref_args)
    assert out.dtype == expected.dtype == torch.float64 and out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    weight = torch.randn(out.shape, generator=G, dtype=out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), args)
    ref_grads = torch.autograd.grad((expected * weight).sum(), ref_args)
    assert len(grads) == len(inputs)
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(prog.f(*inputs), expected.detach(), atol=1e-10, rtol=1e-10)


def test_the_default_eps_of_each_norm_is_torchs() -> None:
    """layer_norm and group_norm 1e-5, rms_norm torch's None (the machine epsilon of x's dtype): on
    values of a tiny spread the eps decides the result."""
    prog = ss.load(DIMS + "fn ln(x: [b D]) -> [b D] = layer_norm(x, over=D)\n"
                   "fn rms(x: [b D]) -> [b D] = rms_norm(x, over=D)\n"
                   "fn gn(x: [b C]) -> [b C] = group_norm(x, 2, over=C)\n", name="eps.ss")
    x = torch.randn(3, 3, generator=G) * 1e-3
    torch.testing.assert_close(prog.ln(x), F.layer_norm(x, (3,), eps=1e-5), atol=0, rtol=0)
    torch.testing.assert_close(prog.rms(x), F.rms_norm(x, (3,)), atol=0, rtol=0)
    y = torch.randn(3, 4, generator=G) * 1e-3
    torch.testing.assert_close(prog.gn(y), F.group_norm(y, 2, eps=1e-5), atol=0, rtol=0)
    assert not torch.allclose(prog.rms(x), F.rms_norm(x, (3,), eps=1e-5))


def test_each_lowers_to_one_call_of_torchs_kernel() -> None:
    source = DIMS + ("fn f(x: [b n D], w: [D], bias: [D]) -> [b n D] = layer_norm(x, w, bias, over=D)\n"
                     "fn g(x: [b n D], w: [D]) -> [b n D] = rms_norm(x, w, over=D)\n"
                     "fn h(x: [b C n], w: [C]) -> [b C n] = group_norm(x, 2, bias=w, over=C)\n")
    text = ss.load(source, name="one.ss").python_source
    assert "_rt.layer_norm(x, 2, w, bias, 1e-05)" in text
    assert "_rt.rms_norm(x, 2, w, None)" in text
    assert "_rt.group_norm(x, 2, 1, None, w, 1e-05, 'one.ss:6:39')" in text


def test_a_group_norm_of_channels_known_only_as_it_runs_checks_them() -> None:
    """With channels of a generic dim, the groups are checked when the call runs: a ShapeError naming
    the call's .ss line, never torch's error."""
    line = "fn f(x: [b c n] f64) -> [b c n] f64 = group_norm(x, 2, over=c)"
    prog = ss.load(DIMS + line + "\n", name="gn.ss")
    x = r(2, 6, 3)
    torch.testing.assert_close(prog.f(x), F.group_norm(x, 2), atol=1e-12, rtol=0)
    with pytest.raises(ss.ShapeError) as info:
        prog.f(r(2, 5, 3))
    col = line.index("group_norm(") + 1
    assert str(info.value).startswith(f"gn.ss:4:{col}: `group_norm` splits 5 channels into 2 groups")


MISUSES = [
    ("fn f(x: [b D]) -> [b D] = layer_norm(x, over=C)", "E0303", "has no axis C"),
    ("fn f(x: [b D]) -> [b D] = layer_norm(x)", "E0206", "`layer_norm` is missing `over`"),
    ("fn f(x: [b D], w: [C]) -> [b D] = layer_norm(x, w, over=D)", "E0301", "weight is [D], one value along"),
    ("fn f(x: [b D], w: [D D]) -> [b D] = layer_norm(x, w, over=D)", "E0301", "weight is [D]"),
    ("fn f(x: [b D], w: [D], bias: [b D]) -> [b D] = layer_norm(x, w, bias, over=D)", "E0301", "bias is [D]"),
    ("fn f(x: [b D], w: [D] f64) -> [b D] = layer_norm(x, w, over=D)", "E0308", "a weight of f64"),
    ("fn f(x: [b D] i64) -> [b D] = layer_norm(x, over=D)", "E0308", "float tensors"),
    ("fn f(x: [b D]) -> [b D] = layer_norm(x, over=D, eps=-1.0)", "E0310", "eps is at least 0"),
    ("fn f(x: [b D]) -> [b D] = layer_norm(x, 2.0, over=D)", "E0401", "takes a tensor"),
    ("fn f(x: [b D]) -> [b D] = rms_norm(x, over=C)", "E0303", "has no axis C"),
    ("fn f(x: [b D], w: [C]) -> [b D] = rms_norm(x, w, over=D)", "E0301", "weight is [D]"),
    ("fn f(x: [b D], w: [D]) -> [b D] = rms_norm(x, w, bias=w, over=D)", "E0206", "no parameter `bias`"),
    ("fn f(x: [b C n]) -> [b C n] = group_norm(x, 3, over=C)", "E0301", "4 channels (C) don't split into 3 groups"),
    ("fn f(x: [b C n]) -> [b C n] = group_norm(x, 0, over=C)", "E0310", "groups"),
    ("fn f(x: [b C n]) -> [b C n] = group_norm(x, 1.5, over=C)", "E0310", "groups"),
    ("fn f(x: [b C n]) -> [b C n] = group_norm(x, n, over=C)", "E0310", "declared dim of known size"),
    ("fn f(x: [b C n]) -> [b C n] = group_norm(x, 1 + 1, over=C)", "E0310", "written as a literal"),
    ("fn f(x: [b C n], k: int) -> [b C n] = group_norm(x, k, over=C)", "E0303", "`k` isn't a dim"),
    ("fn f(x: [b C n]) -> [b C n] = group_norm(x, 2, over=D)", "E0303", "has no axis D"),
    ("fn f(x: [b C n], w: [D]) -> [b C n] = group_norm(x, 2, w, over=C)", "E0301", "weight is [C]"),
    ("fn f(x: [b C n]) -> [b C n] = group_norm(x, over=C)", "E0206", "missing `groups`"),
    # The std library's declaration under the built-in's own name: E0202, whose help says to delete it
    ('extern fn layer_norm(x: [n D], over: Axis[D]) -> [n D] = "shapescript.std.layer_norm"', "E0202",
     "`layer_norm` is a built-in now"),
    ('extern fn rms_norm(x: [n D], over: Axis[D]) -> [n D] = "shapescript.std.rms_norm"', "E0202",
     "`rms_norm` is a built-in now"),
]


@pytest.mark.parametrize("src, code, words", MISUSES, ids=[f"{m[1]}-{m[2][:30]}" for m in MISUSES])
def test_misuses(src: str, code: str, words: str) -> None:
    with pytest.raises(CompileError) as info:
        ss.load(DIMS + src + "\n", name="bad.ss")
    assert info.value.codes == [code], str(info.value)
    assert words in info.value.diagnostics[0].message, str(info.value)


BATCH = DIMS + "\ndata Ex:\n    x: [C D] f64\n\n"


@pytest.mark.parametrize("call", [
    "layer_norm(batch.x, over=D)", "rms_norm(batch.x, over=C)", "group_norm(batch.x, 2, over=C)",
])
def test_along_other_axes_than_the_batch_each_device_normalizes_its_examples(call: str) -> None:
    table = device_table(compile_program(BATCH + f"fn f(batch: [b] Ex) -> [b C D] f64 = {call}\n", "t.ss", "cpu[0 1]"))
    assert not [item for items in table.lines.values() for item in items if item.collective]


@pytest.mark.parametrize("call", [
    "layer_norm(batch.x, over=b)", "rms_norm(batch.x, over=b)",
    "group_norm(rearrange(batch.x, b c d -> c b d), 2, over=C)",  # the batch axis after the channels
    "group_norm(rearrange(batch.x, b c d -> c d b), 1, over=C)",
])
def test_along_the_batch_axis_a_norm_is_E1801_on_several_devices(call: str) -> None:
    """Each device holds a part of the batch: its statistics over the batch axis would be its part's."""
    result = "[b C D]" if call.startswith(("layer", "rms")) else ("[C b D]" if "c b d" in call else "[C D b]")
    source = BATCH + f"fn f(batch: [b] Ex) -> {result} f64 = {call}\n"
    compile_program(source, "t.ss", None)  # one device: the whole batch
    with pytest.raises(CompileError) as info:
        compile_program(source, "t.ss", "cpu[0 1]")
    assert info.value.codes == ["E1801"], str(info.value)


LAYOUT = """dim D = 3
dim H = 4
dim Dh = 2

data Ex:
    x: [D] f64

model Net:
    param w: [D H Dh] f64 = normal(std=0.5)
    param g: [Dh] f64 = ones()
    param gh: [H] f64 = ones()

fn along_dh(m: Net, batch: [b] Ex) -> [b H Dh] f64 = layer_norm(batch.x @ m.w, m.g, over=Dh)
fn along_h(m: Net, batch: [b] Ex) -> [b H Dh] f64 = rms_norm(batch.x @ m.w, m.gh, over=H)
fn groups_of_h(m: Net, batch: [b] Ex) -> [b H Dh] f64 = group_norm(batch.x @ m.w, 2, m.gh, over=H)
fn groups_after(m: Net, batch: [b] Ex) -> [b H Dh] f64 = group_norm(batch.x @ m.w, 1, m.g, over=Dh)
"""


def test_under_split_h_a_norm_keeps_each_devices_heads_unless_it_normalizes_over_h() -> None:
    """Along Dh (H split before it) each device normalizes its own heads and sends nothing; over H,
    or over channels at or before H (group_norm), its operands are gathered whole."""
    source = "devices cpu[0 1]\n    split H\n\n" + LAYOUT
    table = device_table(compile_program(source, "t.ss", None))
    lines = source.splitlines()
    sends = {lines[k - 1].split("(")[0].removeprefix("fn "): [item.collective.op for item in items if item.collective]
             for k, items in table.lines.items()}
    assert sends.get("along_dh", []) == [] and sends.get("groups_after", []) == []
    assert "all-gather" in sends["along_h"] and "all-gather" in sends["groups_of_h"]
    worker = "\n".join(python_modules(compile_program(source, "t.ss", None), (Target.WORKER,)))
    assert "_rt.layer_norm(torch.tensordot(batch.x, m._m_w, dims=1), 2, m._m_g, None, 1e-05)" in worker
    assert "_rt.group_norm(torch.tensordot(batch.x, m._m_w, dims=1), 1, 2, m._m_g, None, 1e-05" in worker
    assert "_rt.cut_heads(_rt.rms_norm(_rt.gather_heads(" in worker and "_rt.gather_heads(m._m_gh, 0" in worker
