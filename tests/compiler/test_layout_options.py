"""`shard params` and `split NAME` under `devices`: what the checker refuses (E1902–E1904), and the
options kept when the devices are given when loading. (tests/several/test_sharding.py and
test_heads.py run them.)"""

from __future__ import annotations

import warnings

import pytest

import shapescript as ss

HEADS = "dim H\ndim Dh = 4\n\nfn f(x: [n H Dh]) -> [n H Dh] = x * 2.0\n"


def codes_of(source: str, **kwargs: object) -> list[str]:
    with pytest.raises(ss.CompileError) as info:
        ss.load(source, **kwargs)
    return info.value.codes


def test_a_size_given_when_loading_is_checked_against_the_devices() -> None:
    source = "devices cpu[0 1 2]\n    split H\n\n" + HEADS
    assert codes_of(source, dims={"H": 10}) == ["E1902"]
    prog = ss.load(source, dims={"H": 12})
    assert prog.devices.split == "H" and prog.devices.count == 3


def test_devices_given_when_loading_keep_the_programs_options() -> None:
    source = "devices cuda[0 1 2]\n    shard params\n    split H\n\n" + HEADS
    prog = ss.load(source, devices="cpu[0 1]", dims={"H": 4})
    assert (prog.devices.count, prog.devices.shard_params, prog.devices.split) == (2, True, "H")
    assert codes_of(source, devices="cpu[0 1 2]", dims={"H": 4}) == ["E1902"]


def test_a_split_of_a_generic_dim_or_a_field_is_not_a_dim() -> None:
    assert codes_of("devices cpu[0 1]\n    split n\n\n" + HEADS, dims={"H": 4}) == ["E1904"]
    assert codes_of("devices cpu[0 1]\n    split x\n\n" + HEADS, dims={"H": 4}) == ["E1904"]


def test_the_options_load_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ss.load("devices cpu\n    split H\n\n" + HEADS, dims={"H": 5})  # one device divides every size
        ss.load("devices cpu[0 1]\n    split H\n    shard params\n\n" + HEADS, dims={"H": 4})


def test_the_errors_point_at_the_option() -> None:
    with pytest.raises(ss.CompileError) as info:
        ss.load("devices cpu[0 1 2 3]\n    shard params\n    split H\n\n" + HEADS, dims={"H": 6})
    (d,) = info.value.diagnostics
    assert (d.code, d.span.line, d.span.col) == ("E1902", 3, 5)
    assert "use 2, 3 or 6 devices" in " ".join(d.help)


def test_the_table_says_how_split_h_lays_out_the_attention_example() -> None:
    """What docs/several-devices.md quotes of `shapescript comms` for the attention example."""
    from programs import GPT

    from shapescript.api import compile_program
    from shapescript.plan.comms_text import report
    text = report(compile_program("devices cuda[0 1 2]\n    split H\n" + GPT, "gpt.ss"))
    assert "`q`: [b H n Dh], split along H: each device holds 4 of H = 12" in text
    assert "its params with H split along it (`blocks.attn.w_o`), the others whole" in text
    assert "all-reduce of the partial results of every device's part of H, added up: 768·b·n × f32 = 3,072·b·n bytes" in text
    assert "every device holding whole batches" in text
