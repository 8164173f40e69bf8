"""ss.load_weights: weights in another project's names and layout, made here in Hugging Face GPT-2's
layout (Conv1D weights [in, out]) and in nanoGPT's (nn.Linear weights [out, in]), loaded into
examples/nanogpt through a name map; every name, shape and dtype checked, nothing changed on a
failure. Nothing is downloaded: the weights are nanoGPT's GPT written in PyTorch (reference.py),
drawn here and written in each layout."""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import sys
import warnings

import pytest
import torch
from safetensors.torch import save_file
from support import ROOT

import shapescript as ss
from shapescript.runtime.model import leaves

HERE = ROOT / "examples" / "nanogpt"
V, T, H, DH, L = 13, 16, 2, 4, 2
D = H * DH
DIMS = {"V": V, "T": T, "H": H, "Dh": DH, "L": L}
TOLERANCE = 1e-6

# gpt.ss's names to GPT2LMHeadModel's and nanoGPT's GPT's (the same names in both).
GPT2_NAMES = {
    "wte": "transformer.wte.weight",
    "wpe": "transformer.wpe.weight",
    "h.{i}.ln_1.{p}": "transformer.h.{i}.ln_1.{p}",
    "h.{i}.attn.c_attn": "transformer.h.{i}.attn.c_attn.weight",
    "h.{i}.attn.c_attn_bias": "transformer.h.{i}.attn.c_attn.bias",
    "h.{i}.attn.c_proj": "transformer.h.{i}.attn.c_proj.weight",
    "h.{i}.attn.c_proj_bias": "transformer.h.{i}.attn.c_proj.bias",
    "h.{i}.ln_2.{p}": "transformer.h.{i}.ln_2.{p}",
    "h.{i}.mlp.c_fc": "transformer.h.{i}.mlp.c_fc.weight",
    "h.{i}.mlp.c_fc_bias": "transformer.h.{i}.mlp.c_fc.bias",
    "h.{i}.mlp.c_proj": "transformer.h.{i}.mlp.c_proj.weight",
    "h.{i}.mlp.c_proj_bias": "transformer.h.{i}.mlp.c_proj.bias",
    "ln_f.{p}": "transformer.ln_f.{p}",
}
# Read by no param: the head tied to wte, and the attention's causal masks (buffers).
NOT_PARAMS = ["lm_head.weight", "transformer.h.{i}.attn.bias", "transformer.h.{i}.attn.masked_bias"]
# nanoGPT's nn.Linear weights are [out, in]; gpt.ss's, as GPT-2's Conv1D, [in out].
LINEARS = ["h.{i}.attn.c_attn", "h.{i}.attn.c_proj", "h.{i}.mlp.c_fc", "h.{i}.mlp.c_proj"]
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def test_the_map_in_the_docs_is_this_one() -> None:
    """docs/ecosystem.md's GPT-2 map, as its block defines it, is the one these tests load by."""
    text = (ROOT / "docs" / "ecosystem.md").read_text()
    [block] = [b for b in text.split("```python\n")[1:] if b.startswith("gpt2_names = {")]
    namespace: dict = {}
    exec(block.split("```")[0], namespace)
    assert namespace["gpt2_names"] == GPT2_NAMES and namespace["not_params"] == NOT_PARAMS
    assert namespace["nanogpt_linears"] == LINEARS


def load_reference():
    spec = importlib.util.spec_from_file_location("nanogpt_reference_weights", HERE / "reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_gpt(devices: str = "cpu", options: str = "") -> ss.Program:
    with warnings.catch_warnings():  # the small sizes replace gpt.ss's GPT-2 ones on purpose
        warnings.filterwarnings("ignore", message=".*sizes given when loading replace", category=UserWarning)
        source = (HERE / "gpt.ss").read_text()
        return ss.load(options + source, name="gpt.ss", dims=DIMS, devices=devices)


@pytest.fixture(scope="module")
def prog() -> ss.Program:
    return load_gpt()


@pytest.fixture(scope="module")
def nanogpt():
    """nanoGPT's GPT, drawn in f32 (so that f64 holds its values exactly), and its state_dict: the
    nanoGPT layout, lm_head.weight tied to wte and each block's causal mask `attn.bias` included."""
    reference = load_reference()
    torch.manual_seed(0)
    hand = reference.GPT(reference.GPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=D))
    with torch.no_grad():  # biases and norms away from their zeros and ones, so that each one counts
        for p in hand.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    state = {k: v.detach().clone() for k, v in hand.state_dict().items()}
    return hand.double().eval(), state


def gpt2_layout(nanogpt_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same weights as GPT2LMHeadModel holds them: Conv1D weights [in, out] (nanoGPT's
    from_pretrained transposes them the other way), and older transformers' `attn.masked_bias`."""
    out = {k: (v.T if k.endswith(CONV1D) else v).contiguous().clone() for k, v in nanogpt_state.items()}
    for i in range(L):
        out[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return out


def tokens(b: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, V, (b, n), generator=torch.Generator().manual_seed(seed))


def assert_loaded(m, source: dict[str, torch.Tensor], report, transposed: bool) -> None:
    """Every param equals the source tensor it was read from (transposed where declared), in f64."""
    state = m.state_dict()
    assert set(report.loaded) == set(state)
    for name, src in report.loaded.items():
        expected = source[src].T if transposed and name in report.transposed else source[src]
        assert torch.equal(state[name], expected.double()), name


def assert_same_logits(prog, m, hand) -> None:
    x = tokens(3, 9, seed=1)
    expected, _ = hand(x)
    torch.testing.assert_close(prog.logits(m, x, ss.Eval), expected.detach(), atol=TOLERANCE, rtol=0)
    assert expected.std() > 0.01


def where(prog, name: str) -> str:
    return dict(leaves(prog.Gpt.spec))[name].where


@pytest.mark.parametrize("form", ["safetensors", "torch.save", "dict"])
def test_gpt2_layout_loads_into_nanogpt_through_a_name_map(prog, nanogpt, tmp_path, form) -> None:
    hand, state = nanogpt
    hf = gpt2_layout(state)
    source = {"safetensors": tmp_path / "model.safetensors", "torch.save": tmp_path / "pytorch_model.bin",
              "dict": hf}[form]
    if form == "safetensors":
        save_file(hf, source)
    elif form == "torch.save":
        torch.save(hf, source)
    m = prog.Gpt.init(seed=1)
    report = ss.load_weights(m, source, GPT2_NAMES, ignore=NOT_PARAMS, cast=True)
    assert report.transposed == () and set(report.cast) == set(report.loaded)
    assert set(report.unused) == {"lm_head.weight"} | {f"transformer.h.{i}.attn.{b}" for i in range(L)
                                                       for b in ("bias", "masked_bias")}
    assert report.loaded["h.1.attn.c_attn"] == "transformer.h.1.attn.c_attn.weight"
    assert_loaded(m, hf, report, transposed=False)
    assert_same_logits(prog, m, hand)


@pytest.mark.parametrize("form", ["torch.save", "nn.Module"])
def test_nanogpt_layout_loads_with_its_linear_weights_transposed(prog, nanogpt, tmp_path, form) -> None:
    hand, state = nanogpt
    source: object = hand
    if form == "torch.save":  # f64, as nanoGPT's own ckpt.pt['model'] of this model would be; wte tied
        source = tmp_path / "ckpt.pt"
        torch.save(hand.state_dict(), source)
    m = prog.Gpt.init(seed=1)
    report = ss.load_weights(m, source, GPT2_NAMES, transpose=LINEARS, ignore=NOT_PARAMS)
    assert report.cast == () and len(report.transposed) == 4 * L
    assert_loaded(m, {k: v.double() for k, v in state.items()}, report, transposed=True)
    assert_same_logits(prog, m, hand)
    assert "loaded 28 tensors of Gpt" in str(report) and "8 transposed" in str(report)


def test_a_models_own_state_round_trips_by_its_own_names(prog, tmp_path) -> None:
    a, b = prog.Gpt.init(seed=0), prog.Gpt.init(seed=1)
    save_file(a.state_dict(), tmp_path / "own.safetensors")
    report = ss.load_weights(b, tmp_path / "own.safetensors")
    assert report.unused == () and report.kept == () and list(report.loaded) == list(a.state_dict())
    for name, value in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], value), name


def test_keep_leaves_params_as_they_are(prog, nanogpt) -> None:
    _, state = nanogpt
    hf = gpt2_layout(state)
    m = prog.Gpt.init(seed=1)
    before = m.state_dict()
    names = {k: v for k, v in GPT2_NAMES.items() if k != "wpe"}
    report = ss.load_weights(m, hf, names, keep=["wpe"], ignore=NOT_PARAMS + ["transformer.wpe.weight"], cast=True)
    assert report.kept == ("wpe",) and "transformer.wpe.weight" in report.unused
    after = m.state_dict()
    assert torch.equal(after["wpe"], before["wpe"])
    assert torch.equal(after["wte"], hf["transformer.wte.weight"].double())


# ---- errors: each names what is wrong, and the model is left as it was ----------------------------

def failing(prog, source, *args, **kwargs) -> str:
    """The message of a load that must fail; the model it was loading is checked unchanged."""
    m = prog.Gpt.init(seed=1)
    before = m.state_dict()
    with pytest.raises(ss.ShapeError) as info:
        ss.load_weights(m, source, *args, **kwargs)
    after = m.state_dict()
    for name, value in before.items():
        assert torch.equal(after[name], value), f"{name} changed by a failed load"
    return str(info.value)


def test_a_wrong_shape_names_both_names_and_both_shapes(prog, nanogpt) -> None:
    _, state = nanogpt
    hf = gpt2_layout(state)
    hf["transformer.h.1.attn.c_attn.weight"] = torch.zeros(D, 2 * D)  # every other tensor fits
    message = failing(prog, hf, GPT2_NAMES, ignore=NOT_PARAMS, cast=True)
    assert message == (f"load_weights from the state dict: `h.1.attn.c_attn` is [8, 24] f64 (declared at "
                       f"{where(prog, 'h.1.attn.c_attn')}), but `transformer.h.1.attn.c_attn.weight` is [8, 16] f32")


def test_a_layout_not_transposed_says_it_would_fit_transposed(prog, nanogpt) -> None:
    _, state = nanogpt
    message = failing(prog, state, GPT2_NAMES, ignore=NOT_PARAMS, cast=True)  # nanoGPT's, nothing transposed
    # c_attn, c_fc and mlp.c_proj in each block; attn.c_proj is square, [D D] either way
    assert message.startswith(f"load_weights from the state dict: {3 * L} problems loading Gpt (declared at gpt.ss:")
    assert (f"  `h.0.attn.c_attn` is [8, 24] f64 (declared at {where(prog, 'h.0.attn.c_attn')}), but "
            f"`transformer.h.0.attn.c_attn.weight` is [24, 8] f32; transposed it would fit: name it in transpose=\n"
            in message)
    gpt2 = failing(prog, gpt2_layout(state), GPT2_NAMES, transpose=LINEARS, ignore=NOT_PARAMS, cast=True)
    assert ("`transformer.h.1.mlp.c_fc.weight` is [8, 32] f32, transposed [32, 8]; as it is stored it fits: "
            "leave it out of transpose=" in gpt2)


def test_a_missing_source_name_is_named_with_the_nearest(prog, nanogpt) -> None:
    _, state = nanogpt
    hf = gpt2_layout(state)
    del hf["transformer.h.0.ln_2.bias"]
    message = failing(prog, hf, GPT2_NAMES, ignore=NOT_PARAMS, cast=True)
    assert message.startswith("load_weights from the state dict: `h.0.ln_2.bias` reads `transformer.h.0.ln_2.bias`, "
                              "which the state dict lacks: did you mean `")


def test_a_param_in_no_entry_and_an_unread_source_tensor_are_listed(prog, nanogpt, tmp_path) -> None:
    _, state = nanogpt
    hf = gpt2_layout(state)
    hf["transformer.extra.weight"] = torch.zeros(3)
    save_file(hf, tmp_path / "extra.safetensors")
    names = {k: v for k, v in GPT2_NAMES.items() if k != "wpe"}
    message = failing(prog, tmp_path / "extra.safetensors", names, ignore=NOT_PARAMS, cast=True)
    path = os.fspath(tmp_path / "extra.safetensors")
    assert message.splitlines() == [
        f"load_weights from {path}: 2 problems loading Gpt (declared at {prog.Gpt.spec.where}):",
        f"  `wpe` ([16, 8] f64, declared at {where(prog, 'wpe')}) is in no entry of names=, nor in keep= to "
        f"leave it as it is",
        f"  2 tensors of {path} are read by no param: `transformer.extra.weight`, `transformer.wpe.weight` "
        f"(map them in names=, or let them go unread with ignore= or strict=False)"]
    # strict=False: the extra tensor goes unread, and is in the report
    m = prog.Gpt.init(seed=1)
    report = ss.load_weights(m, tmp_path / "extra.safetensors", GPT2_NAMES, ignore=NOT_PARAMS, cast=True, strict=False)
    assert "transformer.extra.weight" in report.unused and "transformer.extra.weight" not in report.loaded.values()


def test_map_entries_that_match_nothing_are_named(prog, nanogpt) -> None:
    _, state = nanogpt
    hf = gpt2_layout(state)
    names = {**{k: v for k, v in GPT2_NAMES.items() if k != "h.{i}.attn.c_attn"},
             "h.{i}.attn.w_qkv": "transformer.h.{i}.attn.c_attn.weight"}
    message = failing(prog, hf, names, transpose=["h.{i}.attn.qkv"], ignore=NOT_PARAMS, cast=True)
    assert ("  names= entry `h.{i}.attn.w_qkv` matches no param or buffer of Gpt: did you mean "
            "`h.{i}.attn.c_attn`?\n" in message)
    assert "  transpose= entry `h.{i}.attn.qkv` matches no param or buffer of Gpt" in message
    assert "  `h.0.attn.c_attn` ([8, 24] f64, declared at" in message
    kept = failing(prog, hf, GPT2_NAMES, transpose=["h.{i}.attn.c_attn"], keep=["h.{i}.attn.c_attn", "nothing.{i}"],
                   ignore=NOT_PARAMS + ["transformer.h.{i}.attn.c_attn.{p}"], cast=True)
    assert kept.splitlines()[1:] == ["  names= entry `h.{i}.attn.c_attn` matches only what keep= leaves as it is",
                                     "  transpose= entry `h.{i}.attn.c_attn` matches only what keep= leaves as it is",
                                     "  keep= entry `nothing.{i}` matches no param or buffer of Gpt"]


def test_a_dtype_is_checked_unless_cast(prog, nanogpt) -> None:
    _, state = nanogpt
    message = failing(prog, gpt2_layout(state), GPT2_NAMES, ignore=NOT_PARAMS)
    assert (f"  `wte` is [13, 8] f64 (declared at {where(prog, 'wte')}), but `transformer.wte.weight` is "
            f"[13, 8] f32; cast=True converts it\n" in message)


def test_two_entries_for_one_name_and_bad_patterns_are_refused(prog, nanogpt) -> None:
    _, state = nanogpt
    hf = gpt2_layout(state)
    message = failing(prog, hf, {**GPT2_NAMES, "h.{i}.{ln}.weight": "transformer.h.{i}.{ln}.weight"},
                      ignore=NOT_PARAMS, cast=True)
    assert "`h.0.ln_1.weight` matches two entries of names=: `h.{i}.ln_1.{p}` and `h.{i}.{ln}.weight`" in message
    with pytest.raises(ss.ShapeError, match=r"whose field `\{j\}` is not in `h.\{i\}.attn.c_attn`"):
        ss.load_weights(prog.Gpt.init(seed=0), hf, {"h.{i}.attn.c_attn": "transformer.h.{j}.attn.c_attn.weight"})
    with pytest.raises(ss.ShapeError, match="has a brace that is no field"):
        ss.load_weights(prog.Gpt.init(seed=0), hf, {"h.{0}.attn.c_attn": "x"})


def test_a_file_holding_code_is_never_run(prog, tmp_path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (os.fspath(marker), "w"))

    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"wte": Payload()}, f)
    message = failing(prog, tmp_path / "evil.pt")
    assert message.startswith(f"load_weights: {tmp_path / 'evil.pt'} holds more than weights, and is not read: "
                              f"torch.load with weights_only=True refused it (")
    assert "load_weights never runs a pickle's code" in message and not marker.exists()


def test_a_checkpoint_holding_more_than_tensors_says_where_the_weights_are(prog, nanogpt, tmp_path) -> None:
    _, state = nanogpt
    torch.save({"model": state, "iter_num": 5}, tmp_path / "ckpt.pt")  # nanoGPT's ckpt.pt, in short
    message = failing(prog, tmp_path / "ckpt.pt", GPT2_NAMES)
    assert message.startswith(f"load_weights: {tmp_path / 'ckpt.pt'} holds more than tensors by name (`model`: dict, "
                              f"`iter_num`: int)")
    assert "torch.load(path, weights_only=True)['model']" in message
    (tmp_path / "notes.txt").write_text("not weights\n")
    assert "is neither a safetensors file nor one of torch.save" in failing(prog, tmp_path / "notes.txt")


def test_what_is_not_a_model_or_a_source_is_a_type_error(prog, tmp_path) -> None:
    with pytest.raises(TypeError, match="expected a model"):
        ss.load_weights({"w": torch.zeros(2)}, {})
    with pytest.raises(TypeError, match="the source is a path"):
        ss.load_weights(prog.Gpt.init(seed=0), 42)
    with pytest.raises(FileNotFoundError, match="no file"):
        ss.load_weights(prog.Gpt.init(seed=0), tmp_path / "absent.safetensors")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        ss.load_weights(prog.Gpt.init(seed=0), tmp_path)


@pytest.mark.slow
def test_a_model_on_two_devices_loads_the_same_and_a_failure_changes_nothing(prog, nanogpt, tmp_path) -> None:
    """On cpu[0 1] with `shard params` each worker keeps its piece of each loaded param."""
    hand, state = nanogpt
    hf = gpt2_layout(state)
    save_file(hf, tmp_path / "model.safetensors")
    two = load_gpt("cpu[0 1]", "devices cpu\n    shard params\n\n")
    try:
        m = two.Gpt.init(seed=1)
        assert isinstance(m, ss.parallel.RemoteModel)
        with pytest.raises(TypeError, match="is a read-only view of a sub-model; load into the whole model"):
            ss.load_weights(m.h[0], {})
        before = m.state_dict()
        hf["transformer.ln_f.bias"] = torch.zeros(D + 1)
        with pytest.raises(ss.ShapeError, match=r"`ln_f.bias` is \[8\] f64 .*, but `transformer.ln_f.bias` is \[9\]"):
            ss.load_weights(m, hf, GPT2_NAMES, ignore=NOT_PARAMS, cast=True)
        for name, value in m.state_dict().items():
            assert torch.equal(value, before[name]), name
        report = ss.load_weights(m, tmp_path / "model.safetensors", GPT2_NAMES, ignore=NOT_PARAMS, cast=True)
        assert_loaded(m, gpt2_layout(state), report, transposed=False)
        assert_same_logits(two, m, hand)
        # load_state_dict itself, as one device's: strict, checked before any worker hears of it
        one = prog.Gpt.init(seed=1)
        wrong = {**before, "wpe": torch.zeros(T, D + 1, dtype=torch.float64)}
        with pytest.raises(ss.ShapeError) as on_one:
            one.load_state_dict(wrong)
        with pytest.raises(ss.ShapeError) as on_two:
            m.load_state_dict(wrong)
        at = re.compile(r"gpt\.ss:\d+:\d+")  # two's program has its options' lines above
        assert at.sub("", str(on_two.value)) == at.sub("", str(on_one.value))
        m.load_state_dict(before)
        for name, value in m.state_dict().items():
            assert torch.equal(value, before[name]), name
    finally:
        two.stop()
