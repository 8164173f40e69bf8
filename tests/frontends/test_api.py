"""The Python API: loading, calling functions with Python values, and the errors a caller meets."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from programs import LIN_HEADER, README

import shapescript as ss

# LIN_HEADER's Lin with a buffer too: the first line below is one more member of it.
PROGRAM = LIN_HEADER + textwrap.dedent("""\
        buffer seen: [] i64 = zeros()

    fn logits(m: Lin, x: [b D]) -> [b C] = x @ m.w

    fn pair(x: [b D], z: [b C]) -> [b C] = logits_free(x) + z

    fn logits_free(x: [b D]) -> [b C] = x @ ones_matrix()

    python fn ones_matrix() -> [D C] = "helper_mod.ones_matrix"

    fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(logits(m, batch.x), batch.y, over=C)

    fn step(mut m: Lin, mut opt: Sgd[Lin], batch: [b] Ex) -> []:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l
    """)

HELPER = textwrap.dedent("""\
    import torch
    calls = []
    def ones_matrix():
        calls.append(1)
        return torch.ones(4, 3)
    def bad_matrix():
        return torch.ones(4, 4)
    def broken():
        raise ValueError("broken on purpose")
    """)


@pytest.fixture()
def prog(tmp_path, monkeypatch):
    (tmp_path / "helper_mod.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("helper_mod", None)
    return ss.load(PROGRAM, name="lin.ss")


def test_members_are_attributes(prog) -> None:
    assert set(dir(prog)) >= {"Lin", "Ex", "logits", "loss", "step"}
    with pytest.raises(AttributeError, match="has no `nope`"):
        prog.nope  # noqa: B018  (a read, refused)
    m = prog.Lin.init(seed=1)
    assert m.w.shape == (4, 3) and m.seen.dtype == torch.int64
    assert set(m.state_dict()) == {"w", "seen"}
    assert torch.equal(prog.Lin.init(seed=1).w, m.w)
    assert not torch.equal(prog.Lin.init(seed=2).w, m.w)
    assert "runs workers" in repr(prog.step) and "mut m: Lin" in repr(prog.step)


def test_a_fn_shows_its_ss_signature_to_help_and_to_ipython(prog) -> None:
    """`prog.step?` and help() show the .ss parameters and types, not `(*args, **kwargs)`;
    calling by those names works."""
    import inspect

    from IPython.core.oinspect import Inspector
    signature = inspect.signature(prog.step)
    assert list(signature.parameters) == ["m", "opt", "batch", "background"]
    assert str(signature) == "(m: mut Lin, opt: mut Sgd[Lin], batch: [b] Ex, *, background: bool = False) -> []"
    assert str(inspect.signature(prog.ones_matrix)) == "(*, background: bool = False) -> [D C]"
    assert prog.step.__doc__.splitlines()[0] == "fn step(mut m: Lin, mut opt: Sgd[Lin], batch: [b] Ex) -> []"
    line = next(k for k, text in enumerate(PROGRAM.splitlines(), 1) if text.startswith("fn step("))
    assert f"At lin.ss, line {line}." in prog.step.__doc__
    assert prog.ones_matrix.__doc__.startswith("python fn ones_matrix() -> [D C]\n")
    shown = Inspector(theme_name="nocolor").info(prog.logits, "logits")
    assert shown["definition"] == "logits(m: Lin, x: [b D], *, background: bool = False) -> [b C]"
    assert shown["docstring"].startswith("fn logits(m: Lin, x: [b D]) -> [b C]")
    m = prog.Lin.init(seed=0)
    x = torch.ones(2, 4)
    torch.testing.assert_close(prog.logits(x=x, m=m), x @ m.w)  # by the names the signature shows


def test_mut_arguments_change_in_place(prog) -> None:
    m = prog.Lin.init(seed=0)
    before = m.w.detach().clone()
    opt = ss.sgd(m, lr=0.5)
    batch = {"x": torch.randn(8, 4), "y": torch.randint(0, 3, (8,))}
    loss = prog.step(m, opt, batch)
    assert loss.shape == () and not torch.equal(m.w, before)
    # the same step by hand
    w = before.clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(batch["x"] @ w, batch["y"])
    ref.backward()
    torch.testing.assert_close(m.w.detach(), before - 0.5 * w.grad)
    assert float(loss) == pytest.approx(ref.item())


def test_keywords_and_wrong_arity(prog) -> None:
    m = prog.Lin.init(seed=0)
    x = torch.randn(2, 4)
    assert torch.equal(prog.logits(x=x, m=m), prog.logits(m, x))
    with pytest.raises(TypeError, match="missing x"):
        prog.logits(m)
    with pytest.raises(TypeError, match="no parameter `q`"):
        prog.logits(m, x, q=1)


def test_shape_error_names_the_parameter_and_its_location(prog) -> None:
    m = prog.Lin.init(seed=0)
    with pytest.raises(ss.ShapeError) as info:
        prog.logits(m, torch.randn(5, 3))
    text = str(info.value)
    assert "`x` of `logits` (lin.ss:12:19)" in text and "expected [b D] with D = 4" in text
    assert "got shape [5, 3]" in text


def test_generic_dims_bind_across_arguments(prog) -> None:
    with pytest.raises(ss.ShapeError) as info:
        prog.pair(torch.randn(5, 4), torch.randn(6, 3))
    assert "b was bound to 5 by `x`" in str(info.value)


def test_dtype_and_kind_errors(prog) -> None:
    m = prog.Lin.init(seed=0)
    with pytest.raises(ss.ShapeError, match="expected dtype f32, got f64"):
        prog.logits(m, torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(ss.ShapeError, match="must be Lin, not a tensor"):
        prog.logits(torch.zeros(4, 3), torch.randn(2, 4))
    with pytest.raises(ss.ShapeError, match="must be Sgd\\[Lin\\]"):
        prog.step(m, ss.adamw(m), {"x": torch.randn(2, 4), "y": torch.zeros(2, dtype=torch.int64)})


def test_labels_outside_their_index_raise_domain_error(prog) -> None:
    m = prog.Lin.init(seed=0)
    before = m.w.detach().clone()
    with pytest.raises(ss.DomainError, match="outside Index\\[C\\] with C = 3"):
        prog.step(m, ss.sgd(m), {"x": torch.randn(2, 4), "y": torch.tensor([0, 3])})
    assert torch.equal(m.w, before)  # nothing ran


def test_python_fn_is_called_and_its_result_checked(prog, tmp_path) -> None:
    import helper_mod
    out = prog.logits_free(torch.ones(2, 4))
    assert torch.equal(out, torch.full((2, 3), 4.0)) and helper_mod.calls == [1]
    bad = ss.load(PROGRAM.replace("helper_mod.ones_matrix", "helper_mod.bad_matrix"), name="bad.ss")
    with pytest.raises(ss.ShapeError, match="`result` of `ones_matrix`.*got shape \\[4, 4\\]"):
        bad.logits_free(torch.ones(2, 4))


def test_errors_inside_a_call_name_the_ss_line(prog) -> None:
    broken = ss.load(PROGRAM.replace("helper_mod.ones_matrix", "helper_mod.broken"), name="broken.ss")
    with pytest.raises(ValueError, match="broken on purpose") as info:
        broken.logits_free(torch.ones(2, 4))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "in `logits_free` at broken.ss:16:37: fn logits_free(x: [b D]) -> [b C] = x @ ones_matrix()" in notes
    assert "in `ones_matrix` at broken.ss:18:1" in notes


def test_compile_error_carries_diagnostics() -> None:
    with pytest.raises(ss.CompileError) as info:
        ss.load("dim D = 4\ndim E = 4\nfn f(x: [D], w: [E D]) -> [D] = x @ w\n", name="bad.ss")
    err = info.value
    d = err.diagnostics[0]
    col = "fn f(x: [D], w: [E D]) -> [D] = x @ w".index("x @ w") + 1
    assert (d.code, d.line, d.column) == ("E0304", 3, col)
    assert str(err).startswith("error[E0304]:") and f"--> bad.ss:3:{col}" in str(err)
    assert "dims match by name, never by size" in str(err)


def test_load_from_a_path_and_dims_given_at_load(tmp_path) -> None:
    path = tmp_path / "v.ss"
    path.write_text("dim V\n\nfn f(x: [n V]) -> [n] = sum(x, over=V)\n")
    prog = ss.load(path, dims={"V": 5})
    assert prog.f(torch.ones(2, 5)).tolist() == [5.0, 5.0]
    with pytest.raises(ss.ShapeError, match="with V = 5"):
        prog.f(torch.ones(2, 4))
    with pytest.raises(ss.CompileError, match="no dim `W`"):
        ss.load(path, dims={"W": 5})


def test_a_program_for_several_devices_loads_without_starting_workers() -> None:
    src = README
    prog = ss.load(src, name="mlp.ss")
    assert prog.devices.count == 3 and prog._pool is None
    assert "runs workers" in repr(prog.train_step)
    assert ss.load(src, devices="cpu").devices.count == 1
    with pytest.raises(ValueError, match="devices must be written"):
        ss.load(src, devices="gpu0")
