"""Datasets over files (runtime/files.py): windows of a memory-mapped token file in nanoGPT's layout,
and the rows of Parquet and CSV files read with pyarrow, loaded and checked by a program's loops as
any dataset is, and pickled as their paths and settings only."""

from __future__ import annotations

import pickle
import sys
import warnings

import numpy as np
import pytest
import torch
from programs import LINEAR, bigram_tokens
from support import ROOT

import shapescript as ss

V, T = 16, 8

TOKENS = bigram_tokens(V, T, 6)


def token_file(path, n: int = 203, dtype=np.uint16) -> np.ndarray:
    """`n` tokens in [0, V) written as nanoGPT's prepare.py writes train.bin: `arr.tofile(path)`."""
    tokens = ((np.arange(n) * 7 + np.arange(n) ** 2 % 5) % V).astype(dtype)
    tokens.tofile(path)
    return tokens


def fit(prog, data) -> tuple[list[float], dict[str, torch.Tensor]]:
    m = prog.Bigram.init(seed=0)
    sink = ss.sinks.memory()
    prog.fit(m, ss.adamw(m, lr=0.05), data, sink)
    return [r["loss"] for r in sink.records], {k: v.detach().clone() for k, v in m.state_dict().items()}


# -- token files ------------------------------------------------------------------------------------

@pytest.mark.parametrize("stride", [None, 1, 3])
def test_windows_are_numpys_slices(tmp_path, stride) -> None:
    tokens = token_file(tmp_path / "train.bin")
    ds = ss.TokenFile(tmp_path / "train.bin", block=T, stride=stride)
    step = stride or T
    assert len(ds) == (len(tokens) - T - 1) // step + 1
    for i in [0, 1, len(ds) - 1]:
        start = i * step
        assert ds[i]["tokens"].tolist() == tokens[start:start + T].tolist()
        assert ds[i]["targets"].tolist() == tokens[start + 1:start + 1 + T].tolist()
    got = ds.__getitems__([4, 0, -1])
    assert got["tokens"].dtype == torch.int64 and got["tokens"].shape == (3, T)
    assert got["targets"][2].tolist() == tokens[(len(ds) - 1) * step + 1:][:T].tolist()
    with pytest.raises(IndexError, match=f"index {len(ds)} is out of range"):
        ds.__getitems__([len(ds)])


def test_dtype_offset_and_one_field(tmp_path) -> None:
    header = np.arange(4, dtype=np.int32)  # 16 bytes before the tokens
    tokens = np.arange(50, dtype=np.int32) % V
    (tmp_path / "t.bin").write_bytes(header.tobytes() + tokens.tobytes())
    ds = ss.TokenFile(tmp_path / "t.bin", block=5, dtype="int32", offset=16, fields=("x",))
    assert len(ds) == 10 and set(ds[0]) == {"x"}
    assert ds[9]["x"].tolist() == tokens[45:50].tolist()
    with pytest.raises(ss.ShapeError, match="not a whole number of int32 tokens"):
        ss.TokenFile(tmp_path / "t.bin", block=5, dtype="int32", offset=2)
    with pytest.raises(ss.ShapeError, match="fewer than one window's 51"):
        ss.TokenFile(tmp_path / "t.bin", block=50, dtype="int32", offset=16)
    with pytest.raises(TypeError, match="not a token id's"):
        ss.TokenFile(tmp_path / "t.bin", block=5, dtype="float32")
    with pytest.raises(FileNotFoundError):
        ss.TokenFile(tmp_path / "none.bin", block=5)


def test_pickles_as_its_path_and_maps_the_file_where_it_loads(tmp_path) -> None:
    token_file(tmp_path / "train.bin", n=100_000)
    ds = ss.TokenFile(tmp_path / "train.bin", block=T)
    assert not ds.opened  # making it read the file's size only
    sent = pickle.dumps(ds)
    assert len(sent) < 1000  # its settings, not its 200 kB of tokens
    ds[0]
    assert ds.opened and len(pickle.dumps(ds)) == len(sent)  # the map stays with this process
    copy = pickle.loads(sent)
    assert not copy.opened and torch.equal(copy[5]["tokens"], ds[5]["tokens"]) and copy.opened
    # The file changed after the dataset was made: its copy refuses to read it.
    np.zeros(10, dtype=np.uint16).tofile(tmp_path / "train.bin")
    with pytest.raises(ss.ShapeError, match="can't change under its loops"):
        pickle.loads(sent)[0]


def test_a_loop_over_a_token_file_trains_as_over_a_tensor_dataset_of_its_windows(tmp_path) -> None:
    token_file(tmp_path / "train.bin")
    prog = ss.load(TOKENS, devices="cpu", name="text.ss")
    ds = ss.TokenFile(tmp_path / "train.bin", block=T)
    windows = ds.__getitems__(range(len(ds)))
    losses, params = fit(prog, ds)
    same_losses, same_params = fit(prog, ss.TensorDataset(**windows))
    assert len(losses) == -(-len(ds) // 6) and losses == same_losses
    for name, p in params.items():
        assert torch.equal(p, same_params[name]), name


def test_a_token_outside_the_vocabulary_is_the_loaders_domain_error(tmp_path) -> None:
    tokens = token_file(tmp_path / "train.bin")
    tokens[3 * T + 2] = V  # in item 3's tokens (at 2) and targets (at 1), and no other window
    tokens.tofile(tmp_path / "train.bin")
    prog = ss.load(TOKENS, devices="cpu", name="text.ss")
    m = prog.Bigram.init(seed=0)
    with pytest.raises(ss.DomainError, match=rf"item 3 of the dataset: field `tokens` holds {V} at \[2\], "
                                             rf"outside Index\[V\] with V = {V}"):
        prog.fit(m, ss.adamw(m, lr=0.05), ss.TokenFile(tmp_path / "train.bin", block=T), ss.sinks.memory())


def test_a_window_of_another_length_is_the_loaders_shape_error(tmp_path) -> None:
    token_file(tmp_path / "train.bin")
    prog = ss.load(TOKENS, devices="cpu", name="text.ss")
    m = prog.Bigram.init(seed=0)
    with pytest.raises(ss.ShapeError, match=rf"field `tokens` has shape \[5\], expected \[T\] with T = {T}"):
        prog.fit(m, ss.adamw(m, lr=0.05), ss.TokenFile(tmp_path / "train.bin", block=5), ss.sinks.memory())


def test_examples_nanogpt_evaluates_a_token_file_of_its_text(tmp_path) -> None:
    """gpt.ss's `Text` (tokens and targets: [n] Index[V]) over a token file: nanoGPT's evaluation, batch by
    batch, the same as over a TensorDataset of the same windows."""
    token_file(tmp_path / "train.bin", n=130)
    with warnings.catch_warnings():  # the small sizes replace gpt.ss's GPT-2 ones on purpose
        warnings.filterwarnings("ignore", message=".*sizes given when loading replace", category=UserWarning)
        prog = ss.load(ROOT / "examples" / "nanogpt" / "gpt.ss", dims={"V": V, "T": T, "H": 2, "Dh": 4, "L": 1})
    m = prog.Gpt.init(seed=0)
    data = ss.TokenFile(tmp_path / "train.bin", block=T)
    records = []
    for ds in (data, ss.TensorDataset(**data.__getitems__(range(len(data))))):
        sink = ss.sinks.memory()
        prog.evaluate(m, ds, sink)
        records.append(sink.records)
    assert len(records[0]) == 2 and records[0] == records[1]


# -- Parquet and CSV --------------------------------------------------------------------------------

def rows(n: int = 21) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(0)
    return g.standard_normal((n, 4)).astype(np.float32), (np.arange(n) * 5 % 3).astype(np.int64)


def parquet_file(path, x: np.ndarray, y: np.ndarray) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 4),
                      "label": pa.array(y), "name": pa.array([f"row {i}" for i in range(len(y))]),
                      "lengths": pa.array([list(range(i % 3 + 1)) for i in range(len(y))])})
    pq.write_table(table, path, row_group_size=8)  # three row groups: a take reads across chunks


def test_parquet_rows_are_the_tables(tmp_path) -> None:
    x, y = rows()
    parquet_file(tmp_path / "ex.parquet", x, y)
    ds = ss.ParquetDataset(tmp_path / "ex.parquet", columns={"x": "features", "y": "label"})
    assert len(ds) == 21 and not ds.opened  # only the footer read
    got = ds.__getitems__([20, 0, 9])
    assert torch.equal(got["x"], torch.from_numpy(x[[20, 0, 9]])) and got["y"].tolist() == y[[20, 0, 9]].tolist()
    assert ds.opened and torch.equal(ds[3]["x"], torch.from_numpy(x[3])) and int(ds[3]["y"]) == y[3]
    copy = pickle.loads(pickle.dumps(ds))
    assert not copy.opened and torch.equal(copy[7]["x"], ds[7]["x"])
    # A list column of any length gives items one by one, which the loader pads.
    ragged = ss.ParquetDataset(tmp_path / "ex.parquet", columns={"tokens": "lengths"})
    assert [item["tokens"].tolist() for item in ragged.__getitems__([0, 1, 2])] == [[0], [0, 1], [0, 1, 2]]


def test_csv_rows_are_the_files(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.csv as csv
    x, y = rows()
    csv.write_csv(pa.table({**{f"x{j}": x[:, j] for j in range(4)}, "label": y}), tmp_path / "ex.csv")
    ds = ss.CsvDataset(tmp_path / "ex.csv", columns=["x0", "label"], dtypes={"x0": "float32"})
    got = ds.__getitems__([4, 1])
    assert got["x0"].dtype == torch.float32 and got["x0"].tolist() == x[[4, 1], 0].tolist()
    assert got["label"].tolist() == y[[4, 1]].tolist()
    copy = pickle.loads(pickle.dumps(ds))
    assert not copy.opened and copy[4]["x0"] == got["x0"][0]
    semicolons = tmp_path / "semi.csv"
    semicolons.write_text("a;b\n1;2.5\n3;4.5\n")
    got = ss.CsvDataset(semicolons, delimiter=";").__getitems__([1])
    assert got["a"].tolist() == [3] and got["b"].dtype == torch.float64 and got["b"].tolist() == [4.5]


def test_a_loop_over_a_parquet_file_trains_as_over_a_tensor_dataset_of_its_rows(tmp_path) -> None:
    x, y = rows()
    parquet_file(tmp_path / "ex.parquet", x, y)
    prog = ss.load(LINEAR, devices="cpu", name="fit.ss")
    out = []
    for data in (ss.ParquetDataset(tmp_path / "ex.parquet", columns={"x": "features", "y": "label"}),
                 ss.TensorDataset(x=torch.from_numpy(x), y=torch.from_numpy(y))):
        m = prog.Lin.init(seed=0)
        sink = ss.sinks.memory()
        prog.fit(m, ss.adamw(m, lr=0.1), data, sink)
        out.append(([r["loss"] for r in sink.records], m.state_dict()["w"].detach().clone()))
    assert len(out[0][0]) == 3 and out[0][0] == out[1][0] and torch.equal(out[0][1], out[1][1])


def test_missing_columns_and_wrong_types_are_shape_errors(tmp_path) -> None:
    x, y = rows()
    parquet_file(tmp_path / "ex.parquet", x, y)
    with pytest.raises(ss.ShapeError, match=r"there is no column `labels` \(its columns: features, label, name, "
                                            r"lengths\); did you mean `label`\?"):
        ss.ParquetDataset(tmp_path / "ex.parquet", columns=["features", "labels"])
    with pytest.raises(ss.ShapeError, match="column `name` holds string .*a field takes numbers"):
        ss.ParquetDataset(tmp_path / "ex.parquet", columns=["name"])
    with pytest.raises(ss.ShapeError, match="dtypes names `lable`, which is no field"):
        ss.ParquetDataset(tmp_path / "ex.parquet", columns=["label"], dtypes={"lable": "int32"})
    prog = ss.load(LINEAR, devices="cpu", name="fit.ss")
    m = prog.Lin.init(seed=0)
    # A field missing from the items, and a column of the wrong dtype: the loader's ShapeErrors.
    with pytest.raises(ss.ShapeError, match="has no field `y`"):
        prog.fit(m, ss.adamw(m, lr=0.1), ss.ParquetDataset(tmp_path / "ex.parquet", columns={"x": "features"}),
                 ss.sinks.memory())
    wide = ss.ParquetDataset(tmp_path / "ex.parquet", columns={"x": "features", "y": "label"}, dtypes={"x": "float64"})
    with pytest.raises(ss.ShapeError, match="field `x` of the dataset's items: expected dtype f32, got f64"):
        prog.fit(m, ss.adamw(m, lr=0.1), wide, ss.sinks.memory())


def test_a_missing_value_is_a_domain_error_naming_the_item(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"x": pa.array([[1.0] * 4] * 5, type=pa.list_(pa.float32(), 4)),
                             "y": pa.array([0, 1, None, 2, 0])}), tmp_path / "gap.parquet")
    ds = ss.ParquetDataset(tmp_path / "gap.parquet")
    with pytest.raises(ss.DomainError, match=r"item 2 of the dataset: field `y` has a missing \(null\) value"):
        ds.__getitems__([0, 2])


def test_without_pyarrow_the_error_says_to_install_it(tmp_path, monkeypatch) -> None:
    (tmp_path / "a.csv").write_text("a\n1\n")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    with pytest.raises(ImportError, match=r"CsvDataset reads its file with pyarrow, which is not installed here: "
                                          r"pip install pyarrow"):
        ss.CsvDataset(tmp_path / "a.csv")
