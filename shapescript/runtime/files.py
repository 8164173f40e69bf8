"""Datasets over files: windows of a memory-mapped token file (nanoGPT's train.bin), and the rows of
a Parquet or CSV file, read with pyarrow.

Each is a map-style dataset with `__getitems__` returning a dict of stacked fields, so the loops
load and check a batch at a time (runtime/data.py's `load_items`): a token outside `Index[V]` is
the loader's DomainError naming the item, a column of the wrong shape or dtype its ShapeError. The
file is read in the process that loads the batches, when it first loads one: a dataset pickles as
its path and settings only (`__getstate__`), so on several devices each worker, which is sent the
dataset once (parallel/loading.py), maps or reads the file itself, and the controller reads none
of it (a CSV file, which says nothing of its rows, is read once in the controller to count them).
"""

from __future__ import annotations

import abc
import importlib
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from shapescript.errors import DomainError, ShapeError
from shapescript.names import similar
from shapescript.runtime.data import int_arg


def _indices(indices: Sequence[int] | torch.Tensor, length: int, what: str) -> np.ndarray:
    """`indices` as an int64 array of items in [0, length) (negative ones count from the end, as a
    list's do); an IndexError for one out of range."""
    if isinstance(indices, torch.Tensor):
        idx = indices.detach().to("cpu", torch.int64).numpy()
    else:
        idx = np.asarray(indices if isinstance(indices, range) else list(indices), dtype=np.int64)
    idx = idx.reshape(-1)
    if idx.size and (int(idx.min()) < -length or int(idx.max()) >= length):
        bad = int(idx[(idx < -length) | (idx >= length)][0])
        raise IndexError(f"{what}: index {bad} is out of range for a dataset of {length} items")
    return np.where(idx < 0, idx + length, idx)


def _settings(state: dict[str, Any], *opened: str) -> dict[str, Any]:
    """What pickles of a file dataset: its settings, without what this process opened or read."""
    return {k: v for k, v in state.items() if k not in {"_lock", *opened}}


class TokenFile:
    """Windows of `block` tokens of a file of token ids stored one after another, as nanoGPT's
    prepare.py writes train.bin (`dtype="uint16"`), memory-mapped read-only with numpy.memmap.

    Item k is the window starting at token k * stride (`stride` defaults to `block`: windows side by
    side, each token once an epoch; `stride=1`: every offset, nanoGPT's random sampling): `tokens`,
    its `block` tokens, and `targets`, the `block` tokens one further on (`fields=` names them; one
    name gives only the windows). Values come as int64; the loader checks them against the data
    type's `Index[V]`. Making one reads nothing but the file's size."""

    def __init__(self, path: str | os.PathLike[str], block: int, *, dtype: Any = "uint16",
                 stride: int | None = None, offset: int = 0,
                 fields: Sequence[str] = ("tokens", "targets")) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.block = int_arg(block, "TokenFile", "block")
        self.stride = self.block if stride is None else int_arg(stride, "TokenFile", "stride")
        self.offset = int_arg(offset, "TokenFile", "offset")
        if self.block <= 0 or self.stride <= 0 or self.offset < 0:
            raise DomainError(f"TokenFile: block and stride must be positive and offset (in bytes) at least 0, "
                              f"got block={self.block}, stride={self.stride}, offset={self.offset}")
        try:
            kind = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"TokenFile: dtype {dtype!r} is not a numpy dtype ({e})") from None
        if kind.kind not in "iu" or (kind.kind == "u" and kind.itemsize == 8):
            raise TypeError(f"TokenFile: dtype {kind} is not a token id's: an integer dtype of numpy's, as "
                            f"uint16 (nanoGPT's) or int32; uint64 can't be held as an int64")
        self.dtype = kind.str  # "<u2": the byte order too
        names = (fields,) if isinstance(fields, str) else tuple(fields)
        if len(names) not in (1, 2) or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            raise TypeError(f"TokenFile: fields must be one or two names (the windows, and the windows one token "
                            f"further on), got {fields!r}")
        self.fields = names
        self.size = os.path.getsize(self.path)  # the only thing read now (FileNotFoundError if there's no file)
        data = self.size - self.offset
        if data < 0 or data % kind.itemsize:
            raise ShapeError(f"TokenFile({self.path}): its {self.size:,} bytes past the offset of {self.offset} "
                             f"are not a whole number of {kind.name} tokens ({kind.itemsize} bytes each)")
        self.tokens = data // kind.itemsize
        self.width = self.block + len(names) - 1  # tokens a window reads: one more for its targets
        if self.tokens < self.width:
            raise ShapeError(f"TokenFile({self.path}): it holds {self.tokens:,} tokens, fewer than one window's "
                             f"{self.width} (block={self.block}{' and its targets' if len(names) > 1 else ''})")
        self.length = (self.tokens - self.width) // self.stride + 1
        self._map: np.ndarray | None = None
        self._lock = threading.Lock()

    # -- pickled as its path and settings: each process maps the file itself ------------------------

    def __getstate__(self) -> dict[str, Any]:
        return _settings(self.__dict__, "_map")

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._map, self._lock = None, threading.Lock()

    @property
    def opened(self) -> bool:
        """Whether this process has mapped the file (it does when it first loads an item)."""
        return self._map is not None

    def _tokens(self) -> np.ndarray:
        with self._lock:
            if self._map is None:
                size = os.path.getsize(self.path)
                if size != self.size:
                    raise ShapeError(f"TokenFile({self.path}): the file has {size:,} bytes here, but had {self.size:,} "
                                     f"where the dataset was made; a dataset's items can't change under its loops")
                self._map = np.memmap(self.path, dtype=np.dtype(self.dtype), mode="r", offset=self.offset,
                                      shape=(self.tokens,))
            return self._map

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = int_arg(i, "TokenFile[i]", "i")
        return {name: t[0] for name, t in self.__getitems__([i]).items()}

    def __getitems__(self, indices: Sequence[int] | torch.Tensor) -> dict[str, torch.Tensor]:
        """The windows of items `indices`, stacked: each field `[len(indices), block]` int64."""
        starts = _indices(indices, self.length, "TokenFile") * self.stride
        # Fancy indexing of the map reads just these windows' pages, into an array of our own.
        rows = self._tokens()[starts[:, None] + np.arange(self.width)]
        windows = torch.from_numpy(rows.astype(np.int64, copy=False))
        return {name: windows[:, k:k + self.block].contiguous() for k, name in enumerate(self.fields)}

    def __repr__(self) -> str:
        return (f"TokenFile({self.path!r}, block={self.block}, dtype={np.dtype(self.dtype).name}, "
                f"stride={self.stride}): {self.length:,} windows of {self.tokens:,} tokens")


# -- Parquet and CSV, through pyarrow -----------------------------------------------------------------

def _arrow(module: str = "pyarrow", what: str = "") -> Any:
    """pyarrow's `module`, imported when a dataset first needs it (`what`: the dataset's class, for the
    error that says to install pyarrow); typed Any, as pyarrow ships no types."""
    try:
        importlib.import_module("pyarrow")  # first, whatever submodules were imported before
    except ImportError:
        if not what:
            raise
        raise ImportError(f"{what} reads its file with pyarrow, which is not installed here: "
                          f"pip install pyarrow (or shapescript[arrow])") from None
    return importlib.import_module(module)


_TAKES = ("a field takes numbers: a column of booleans, integers or floats (a `[]` field), a fixed-size list "
          "of them (`[D]`; of fixed-size lists, `[A B]`), or a list of them (`[n]`, each row as long as it is)")


class _Table(abc.ABC):
    """A dataset of a table's rows: item k is row k, its fields the columns named by `columns` (None:
    every column, by its own name; a list of names; or a dict from each field to its column). The
    table is read where the items load, once per process; `dtypes` converts a field's values
    (`{"x": "float32"}`) as they are taken."""

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str] | Mapping[str, str] | None,
                 dtypes: Mapping[str, Any] | None) -> None:
        self.path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"{self.name}: there is no file {self.path}")
        self._table: Any = None
        self._lock = threading.Lock()
        schema = self._schema()
        given = list(schema.names)
        if columns is None:
            mapping = {c: c for c in given}
        elif isinstance(columns, Mapping):
            mapping = dict(columns)
        elif isinstance(columns, str):
            raise TypeError(f"{self.name}: columns must be a list of names or a dict from field to column, "
                            f"not the string {columns!r} (for one column: [{columns!r}])")
        else:
            mapping = {c: c for c in columns}
        if not mapping:
            raise ShapeError(f"{self.name}: no columns to take (its columns: {', '.join(given) or 'none'})")
        for field, column in mapping.items():
            if not isinstance(field, str) or not isinstance(column, str):
                raise TypeError(f"{self.name}: columns are named by strings, got {field!r}: {column!r}")
            if column not in given:
                hint = similar(column, given)
                raise ShapeError(f"{self.name}: there is no column `{column}` (its columns: {', '.join(given)})"
                                 f"{'; ' + hint if hint else ''}")
            problem = _unsupported(schema.field(column).type, top=True)
            if problem:
                raise ShapeError(f"{self.name}: column `{column}` holds {schema.field(column).type} ({problem}); "
                                 f"{_TAKES}")
        self.columns = mapping
        self.dtypes: dict[str, str] = {}
        for field, dtype in (dtypes or {}).items():
            if field not in mapping:
                hint = similar(str(field), mapping)
                raise ShapeError(f"{self.name}: dtypes names `{field}`, which is no field of its items (those: "
                                 f"{', '.join(mapping)}){'; ' + hint if hint else ''}")
            self.dtypes[field] = np.dtype(dtype).str
        self.ragged = any(_is_list(schema.field(c).type) for c in mapping.values())  # items stacked by the loader
        self.length = self._rows()

    @property
    def name(self) -> str:
        return f"{type(self).__name__}({self.path})"

    # -- what each format says -------------------------------------------------------------------

    @abc.abstractmethod
    def _schema(self) -> Any:
        """The table's columns and their types, read without its rows."""

    @abc.abstractmethod
    def _rows(self) -> int:
        """How many rows the table has."""

    @abc.abstractmethod
    def _read(self) -> Any:
        """The whole table, as it is read in the process that loads its items."""

    # -- pickled as its path and settings: each process reads the file itself ----------------------

    def __getstate__(self) -> dict[str, Any]:
        return _settings(self.__dict__, "_table")

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._table, self._lock = None, threading.Lock()

    @property
    def opened(self) -> bool:
        """Whether this process holds the table (it reads it when it first loads an item)."""
        return self._table is not None

    def table(self) -> Any:
        with self._lock:
            if self._table is None:
                table = self._read()
                if table.num_rows != self.length:
                    raise ShapeError(f"{self.name}: the file has {table.num_rows:,} rows here, but had {self.length:,} "
                                     f"where the dataset was made; a dataset's items can't change under its loops")
                self._table = table
            return self._table

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = int_arg(i, f"{type(self).__name__}[i]", "i")
        got = self.__getitems__([i])
        return got[0] if isinstance(got, list) else {name: t[0] for name, t in got.items()}

    def __getitems__(self, indices: Sequence[int] | torch.Tensor) -> Any:
        """Rows `indices`: a dict of stacked fields, or, where a column is a list of any length (`[n]`),
        a list of items, which the loader pads to the batch's longest."""
        idx = _indices(indices, self.length, type(self).__name__)
        pa = _arrow(what=type(self).__name__)
        rows = pa.array(idx, type=pa.int64())
        table = self.table()
        values: dict[str, Any] = {}
        for field, column in self.columns.items():
            taken = table.column(column).take(rows)
            array = taken.combine_chunks() if taken.num_chunks != 1 else taken.chunk(0)
            values[field] = self._values(field, array, idx)
        if not self.ragged:
            return {field: torch.from_numpy(v) for field, v in values.items()}
        return [{field: torch.from_numpy(v[k]) if isinstance(v, list) else torch.from_numpy(v[k:k + 1]).squeeze(0)
                 for field, v in values.items()} for k in range(len(idx))]

    def _values(self, field: str, array: Any, idx: np.ndarray) -> Any:
        """A column's taken values as one numpy array (rows first), or a list of one per row for a
        list column of any length; a DomainError for a missing (null) value, naming the item."""
        convert = self.dtypes.get(field)
        if _is_list(array.type):
            _refuse_nulls(self.name, field, array, idx, 1)
            offsets = array.offsets.to_numpy()
            flat = _fixed(self.name, field, array.flatten(), None)
            if convert:
                flat = flat.astype(convert)
            start = int(offsets[0])
            return [flat[int(a) - start:int(b) - start] for a, b in zip(offsets[:-1], offsets[1:])]
        out = _fixed(self.name, field, array, idx)
        return out.astype(convert) if convert else out

    def __repr__(self) -> str:
        return f"{self.name}: {self.length:,} rows, fields {', '.join(self.columns)}"


def _is_list(t: Any) -> bool:
    pa = _arrow()
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _unsupported(t: Any, top: bool) -> str:
    """Why a column of type `t` can't give a field's values, or ""."""
    pa = _arrow()
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return ""
    if pa.types.is_fixed_size_list(t):
        return _unsupported(t.value_type, top=False)
    if _is_list(t):
        if not top:
            return "a list of any length inside another list"
        inner = t.value_type
        return "a list of any length inside a list" if _is_list(inner) else _unsupported(inner, top=False)
    return "not numbers"


def _refuse_nulls(name: str, field: str, array: Any, idx: np.ndarray | None, per_row: int) -> None:
    """A DomainError naming the item of the first missing value of `array`, whose `per_row` values
    make one row (idx None: the items aren't known here, where a list's values are read)."""
    if not array.null_count:
        return
    pc = _arrow("pyarrow.compute")
    first = int(pc.index(pc.is_null(array), True).as_py())
    item = f"item {int(idx[first // per_row])} of the dataset" if idx is not None else "an item of the dataset"
    raise DomainError(f"{item}: field `{field}` has a missing (null) value in {name}; a field's values are "
                      f"all numbers (drop or fill the missing ones)")


def _fixed(name: str, field: str, array: Any, idx: np.ndarray | None, per_row: int = 1) -> np.ndarray:
    """The values of a column of numbers or fixed-size lists of them: an array of shape
    [rows, *list sizes], writable (torch.from_numpy shares it)."""
    _refuse_nulls(name, field, array, idx, per_row)
    pa = _arrow()
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        inner = _fixed(name, field, array.flatten(), idx, per_row * size)
        return inner.reshape(len(array), size, *inner.shape[1:])
    return np.array(array.to_numpy(zero_copy_only=False))  # a copy of our own: pyarrow's is read-only


class ParquetDataset(_Table):
    """The rows of a Parquet file (pyarrow.parquet): item k is row k, a field per column. Making one
    reads the file's footer only (its columns and how many rows); the process that loads the items
    reads the columns it takes, once."""

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str] | Mapping[str, str] | None = None, *,
                 dtypes: Mapping[str, Any] | None = None) -> None:
        super().__init__(path, columns, dtypes)

    def _file(self) -> Any:
        return _arrow("pyarrow.parquet", "ParquetDataset").ParquetFile(self.path)

    def _schema(self) -> Any:
        return self._file().schema_arrow

    def _rows(self) -> int:
        return int(self._file().metadata.num_rows)

    def _read(self) -> Any:
        return _arrow("pyarrow.parquet", "ParquetDataset").read_table(self.path, columns=list(dict.fromkeys(self.columns.values())), memory_map=True)


class CsvDataset(_Table):
    """The rows of a CSV file (pyarrow.csv), its first line the columns' names: item k is row k, a
    field per column. A CSV file doesn't say how many rows it has, so making one reads it (and keeps
    it, for this process's loads); on several devices each worker reads it again for itself.
    A CSV's floats are float64: `dtypes={"x": "float32"}` converts them for an `f32` field."""

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str] | Mapping[str, str] | None = None, *,
                 dtypes: Mapping[str, Any] | None = None, delimiter: str = ",") -> None:
        self.delimiter = delimiter
        super().__init__(path, columns, dtypes)

    def _schema(self) -> Any:
        self._table = self._read()
        return self._table.schema

    def _rows(self) -> int:
        return int(self._table.num_rows)

    def _read(self) -> Any:
        csv = _arrow("pyarrow.csv", "CsvDataset")
        return csv.read_csv(self.path, parse_options=csv.ParseOptions(delimiter=self.delimiter))
