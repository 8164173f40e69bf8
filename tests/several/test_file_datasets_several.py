"""Datasets over files on two devices: each worker is sent the dataset's path and settings, maps or
reads the file itself and loads its part of each batch; the controller reads none of it, and the
program trains as on one device."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import torch
from programs import LINEAR, bigram_tokens

import shapescript as ss

pytestmark = pytest.mark.slow

V, T = 16, 8

TOKENS = bigram_tokens(V, T, 7)


def trained(source: str, model: str, devices: str, data) -> tuple[list[float], dict[str, torch.Tensor]]:
    prog = ss.load(source, devices=devices, name="fit.ss")
    try:
        m = getattr(prog, model).init(seed=0)
        sink = ss.sinks.memory()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "can't be sent to the workers" would be a failure
            for _ in range(2):  # two epochs: the second loop finds the dataset on the workers already
                prog.fit(m, ss.adamw(m, lr=0.05), data, sink)
        return [r["loss"] for r in sink.records], {k: v.detach().clone() for k, v in m.state_dict().items()}
    finally:
        prog.stop()


def same(one, two) -> None:
    assert len(one[0]) == len(two[0]) > 2
    assert two[0] == pytest.approx(one[0], abs=1e-6)
    for name, p in one[1].items():
        torch.testing.assert_close(two[1][name], p, atol=1e-6, rtol=0)


def test_a_token_file_trains_on_two_devices_as_on_one_and_the_workers_map_it(tmp_path) -> None:
    n = 20_000  # 40 kB of tokens, read as 29 windows 700 tokens apart
    tokens = ((np.arange(n) * 7 + np.arange(n) ** 2 % 5) % V).astype(np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    one = trained(TOKENS, "Bigram", "cpu", ss.TokenFile(tmp_path / "train.bin", block=T, stride=700))
    data = ss.TokenFile(tmp_path / "train.bin", block=T, stride=700)
    assert len(data) == 29 and len(pickle.dumps(data)) < 1000  # what the workers are sent: the path and settings
    two = trained(TOKENS, "Bigram", "cpu[0 1]", data)
    same(one, two)
    assert not data.opened  # the controller never mapped the file: the workers loaded every batch


def test_a_parquet_file_trains_on_two_devices_as_on_one_and_the_workers_read_it(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    g = np.random.default_rng(0)
    x, y = g.standard_normal((21, 4)).astype(np.float32), np.arange(21) * 5 % 3
    pq.write_table(pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 4), "y": pa.array(y)}),
                   tmp_path / "ex.parquet")
    one = trained(LINEAR, "Lin", "cpu", ss.ParquetDataset(tmp_path / "ex.parquet"))
    data = ss.ParquetDataset(tmp_path / "ex.parquet")
    two = trained(LINEAR, "Lin", "cpu[0 1]", data)
    same(one, two)
    assert not data.opened  # the controller read the footer only


def test_a_bad_token_on_two_devices_is_the_loaders_domain_error(tmp_path) -> None:
    tokens = ((np.arange(300) * 7) % V).astype(np.uint16)
    tokens[5 * T + 3] = V + 4  # item 5's alone
    tokens.tofile(tmp_path / "train.bin")
    prog = ss.load(TOKENS, devices="cpu[0 1]", name="fit.ss")
    try:
        m = prog.Bigram.init(seed=0)
        before = m.state_dict()["wte"].clone()
        with pytest.raises(ss.DomainError, match=rf"item 5 of the dataset: field `tokens` holds {V + 4} at \[3\]"):
            prog.fit(m, ss.adamw(m, lr=0.05), ss.TokenFile(tmp_path / "train.bin", block=T), ss.sinks.memory())
        assert not torch.equal(m.state_dict()["wte"], before)  # the batches before the bad one trained
    finally:
        prog.stop()
