"""Data at run time: the specs of `data` types, batches, and checked loading from datasets.

Every tensor that enters a program from outside is checked here against its `data` declaration:
shape (fixed dims must match, generic dims bind once per item), dtype (converted only where no
value can change, `lossless`) and `Index[C]` bounds. Errors name the dataset item, the field, what
was expected and what came, and the .ss line that declared the field. The loops over datasets
(`shuffle`, `batches` and the hooks they run through) are in runtime/loops.py.
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from shapescript.errors import DomainError, ShapeError
from shapescript.names import DATA_RESERVED, is_reserved, similar
from shapescript.runtime.model import dtype_name, shape_text

np: ModuleType | None
try:  # numpy is optional; only needed to copy read-only arrays torch would warn about
    import numpy as np
except ImportError:  # pragma: no cover
    np = None


@dataclass(frozen=True)
class FieldSpec:
    name: str
    dims: tuple[tuple[str, int | None], ...]  # per axis: (label as written, size; None: generic)
    dtype: torch.dtype  # Index fields are torch.int64
    index_bound: int | None  # Index[C]: values are integers in [0, bound)
    bound_label: str | None  # "C", for "Index[C] with C = 10"
    where: str  # the field's declaration, "digits.ss:7:5"
    type_text: str  # "[D]" or "[] Index[C]" as written


@dataclass(frozen=True)
class DataSpec:
    name: str
    fields: tuple[FieldSpec, ...]
    where: str
    # Set by __post_init__: each field's name, dtype, shape after the batch axis and Index bound when every
    # dim of every field has a size (None when some field has a generic dim): what `as_given` compares with.
    as_given: tuple[tuple[str, torch.dtype, tuple[int, ...], int | None], ...] | None = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Emitted by the code generator, so a bad spec is our bug: fail when the program loads.
        seen: set[str] = set()
        for f in self.fields:
            if f.name in seen or is_reserved(f.name, DATA_RESERVED):
                raise ValueError(f"{f.where}: field name `{f.name}` is repeated or reserved "
                                 f"in data {self.name}")
            seen.add(f.name)
        given = tuple((f.name, f.dtype, tuple(size for _, size in f.dims), f.index_bound) for f in self.fields)
        object.__setattr__(self, "as_given", None if any(None in shape for _, _, shape, _ in given) else given)


class Batch:
    """A batch of examples: each field is an attribute holding `[n, ...]`. Every attribute of its
    own is in names.DATA_RESERVED or starts with `_`.

    `Batch(spec, fields, lengths)` is the batch made by hand (`ss.Batch(prog.Line, ...)`): its fields
    are checked as a call's batch argument is, and its lengths against them (`checked_lengths`).
    Batches the runtime makes from values it has checked already are built by `trusted_batch`."""

    spec: DataSpec
    size: int
    lengths: dict[str, torch.Tensor]  # each item's size along a padded generic dim, by its name

    def __init__(self, spec: DataSpec, fields: Mapping[str, Any], lengths: Mapping[str, Any] | None = None) -> None:
        if not isinstance(spec, DataSpec):
            raise TypeError(f"ss.Batch: expected a program's data type (as `prog.Digit`), got {type(spec).__name__}")
        made = f"ss.Batch({spec.name})"
        checked = _check_record(spec, fields, _Origin(made=made))
        rows = int(next(iter(checked.values())).shape[0]) if checked else 0
        if not rows:
            raise ShapeError(f"{made}: the batch is empty; a batch has one row or more")
        _fill(self, spec, checked, rows, checked_lengths(spec, checked, rows, lengths, made))

    def __repr__(self) -> str:
        parts = ", ".join(f"{f.name}: {shape_text(t.shape)} {dtype_name(t.dtype)}"
                          for f, t in zip(self.spec.fields, batch_fields(self).values()))
        return f"Batch[{self.size}] {self.spec.name}({parts})"


def _fill(batch: Batch, spec: DataSpec, fields: Mapping[str, torch.Tensor], rows: int,
          lengths: Mapping[str, torch.Tensor]) -> Batch:
    batch.__dict__.update(fields)
    batch.spec, batch.size, batch.lengths = spec, rows, dict(lengths)
    return batch


def trusted_batch(spec: DataSpec, fields: Mapping[str, torch.Tensor],
                  lengths: Mapping[str, torch.Tensor] | None = None) -> Batch:
    """A Batch of fields and lengths the runtime has checked already (loaded, split, moved or padded
    by us), built without checking them again: the loops' and workers' way, on every batch."""
    rows = int(next(iter(fields.values())).shape[0]) if fields else 0
    return _fill(Batch.__new__(Batch), spec, fields, rows, lengths or {})


def checked_lengths(spec: DataSpec, fields: Mapping[str, torch.Tensor], rows: int, lengths: Any,
                    made: str) -> dict[str, torch.Tensor]:
    """A hand-made batch's `lengths`, checked against its checked `fields`: a dict from a generic
    dim's name to one whole number per row, each from 0 to the size the fields are padded to along
    that dim; made i64 on the fields' device. A ShapeError for a wrong name, type, dtype or count;
    a DomainError for a length out of range. Without them every example is full length."""
    if lengths is None:
        return {}
    padded: dict[str, int] = {}  # the fields' size along each generic dim (bound alike in every field)
    for f in spec.fields:
        for k, (label, size) in enumerate(f.dims):
            if size is None:
                padded.setdefault(label, int(fields[f.name].shape[1 + k]))
    dims = ", ".join(f"`{label}`" for label in padded) or "none"
    if not isinstance(lengths, Mapping):
        raise ShapeError(f"{made}: `lengths` is a {type(lengths).__name__}, expected a dict from a generic "
                         f"dim's name to each example's length (the generic dims of {spec.name}'s fields: {dims}; "
                         f"declared at {spec.where})")
    device = next(iter(fields.values())).device
    out = {}
    for name, value in lengths.items():
        if name not in padded:
            hint = similar(name, padded) if isinstance(name, str) else ""
            raise ShapeError(f"{made}: `lengths` names {name!r}, which is no generic dim of {spec.name}'s fields "
                             f"(those: {dims}; declared at {spec.where}){'; ' + hint if hint else ''}")
        what = f"{made}: lengths[{name!r}]"
        try:
            t = _as_tensor(value)
        except _CONVERSION_ERRORS as e:
            raise ShapeError(f"{what} is a {type(value).__name__} that is not an array of numbers ({e}); "
                             f"expected one length per example, [{rows}] i64") from None
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool or \
                not lossless(t.dtype, torch.int64):
            raise ShapeError(f"{what} has dtype {dtype_name(t.dtype)}, expected whole numbers (i64)")
        if tuple(t.shape) != (rows,):
            raise ShapeError(f"{what} has shape {shape_text(t.shape)}, expected [{rows}]: one length for each "
                             f"of the batch's {rows} examples")
        t = t.to(device=device, dtype=torch.int64)
        size = padded[name]
        if not in_bounds(t, size + 1):
            row = int(((t < 0) | (t > size)).nonzero()[0, 0])
            raise DomainError(f"{what} holds {int(t[row])} at [{row}], outside 0 to {size}: the fields are "
                              f"{size} long along `{name}` (declared at {spec.where})")
        out[name] = t
    return out


def batch_fields(batch: Batch) -> dict[str, torch.Tensor]:
    """The fields of a batch by name, in declaration order."""
    return {f.name: batch.__dict__[f.name] for f in batch.spec.fields}


class _Origin:
    """Where checked values come from, to word messages: one dataset item (`index`), a stacked
    batch of dataset items (`indices`, one per row), a batch passed from Python (`where`: the
    parameter it goes to), or one made by hand (`made`: "ss.Batch(Line)")."""

    def __init__(self, index: int | None = None, indices: Sequence[int] | torch.Tensor | None = None,
                 where: str | None = None, made: str | None = None) -> None:
        self.index, self.indices, self.where, self.made = index, indices, where, made
        self.rows = index is None  # the values have a leading batch axis
        self.given = where is not None or made is not None  # a batch from Python, whatever its rows

    def record(self, row: int = 0) -> str:
        if self.made is not None:
            return self.made
        if self.index is not None:
            return f"item {self.index} of the dataset"
        if self.indices is not None:
            return f"item {int(self.indices[row])} of the dataset" if len(self.indices) else "empty batch"
        return "batch"

    def subject(self, f: FieldSpec, row: int = 0) -> str:
        if self.made is not None:
            return f"{self.made}: field `{f.name}`"
        if self.where is not None:
            return f"batch field `{f.name}`"
        return f"{self.record(row)}: field `{f.name}`"

    def field(self, f: FieldSpec) -> str:
        """The field as a whole (its dtype is the same in every row)."""
        if self.made is not None:
            return f"{self.made}: field `{f.name}`"
        return f"batch field `{f.name}`" if self.where is not None else f"field `{f.name}` of the dataset's items"

    def declared(self, f: FieldSpec) -> str:
        extra = f"; the batch goes to {self.where}" if self.where is not None else ""
        return f"(declared at {f.where}{extra})"


def dense_problem(t: torch.Tensor) -> str:
    """Why `t` can't stand for a value of the program, or "": a meta tensor has no values, and a
    sparse one would fail deep inside an operation."""
    if t.is_meta:
        return "a meta tensor, which has a shape but no values"
    if t.layout != torch.strided:
        return f"a {str(t.layout).removeprefix('torch.')} tensor; pass it as .to_dense()"
    return ""


def _as_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if dense_problem(value):
            raise TypeError(dense_problem(value))
        return value
    if np is not None and isinstance(value, np.ndarray) and not value.flags.writeable:
        value = value.copy()
    return torch.as_tensor(value)


# What torch.as_tensor raises for ragged lists, strings, objects and huge ints.
_CONVERSION_ERRORS = (TypeError, ValueError, RuntimeError, OverflowError)


def _tensor(value: Any, f: FieldSpec, origin: _Origin) -> torch.Tensor:
    try:
        return _as_tensor(value)
    except _CONVERSION_ERRORS as e:
        raise ShapeError(f"{origin.subject(f)} is a {type(value).__name__} that is not an array "
                         f"of numbers ({e}); expected {f.type_text} {origin.declared(f)}") from None


def wrong_dim(k: int, size: int, label: str, want: int | None) -> str:
    """`dim 1 is 783, not D = 784`: an axis named by its index as PyTorch counts it (`t.shape[1]`),
    with the dim it should be and, where known and not the label itself, that dim's size."""
    named = label if want is None or label == str(want) else f"{label} = {want}"
    return f"dim {k} is {size}, not {named}"


def _check_shape(f: FieldSpec, t: torch.Tensor, origin: _Origin,
                 bound: dict[str, tuple[int, str]]) -> None:
    """Check `t` against the field's dims, binding generic dims in `bound` (label -> size, by)."""
    shape = tuple(t.shape)
    dims: list[tuple[str, int | None]] = list(f.dims)
    if origin.rows:
        if not shape:
            raise ShapeError(f"{origin.subject(f)} is a scalar, expected one row per item of the "
                             f"batch, {f.type_text} each {origin.declared(f)}")
        if origin.indices is not None and shape[0] != len(origin.indices):
            raise ShapeError(f"{origin.subject(f)} has {shape[0]} rows for the "
                             f"{len(origin.indices)} items of the batch {origin.declared(f)}")
        if origin.given:
            dims.insert(0, ("b", None))  # the batch axis binds across fields like a generic dim
        else:
            shape = shape[1:]  # stacked dataset items: report the per-item shape
    notes: dict[str, str] = {}
    ok = len(shape) == len(dims)
    first_bad: str = ""  # the first wrong axis, by its index in the shape the message shows
    for k, ((label, size), n) in enumerate(zip(dims, shape)):
        want = size if size is not None else bound[label][0] if label in bound else None
        if want is not None and n != want:
            ok = False
            first_bad = first_bad or wrong_dim(k, n, label, want)
        if size is None and label in bound and bound[label][0] != n:
            notes[label] = f"{label} = {bound[label][0]} (bound by field `{bound[label][1]}`)"
        elif size is None:
            bound.setdefault(label, (n, f.name))
    if ok:
        return
    for label, size in dims:
        if size is not None and label != str(size):
            notes.setdefault(label, f"{label} = {size}")
    with_ = f" with {', '.join(notes.values())}" if notes else ""
    expected = "[" + " ".join(label for label, _ in dims) + "]"
    raise ShapeError(f"{origin.subject(f)} has shape {shape_text(shape)}, expected "
                     f"{expected}{with_}{'; ' + first_bad if first_bad else ''} {origin.declared(f)}")


def _refuse(f: FieldSpec, t: torch.Tensor, bad: torch.Tensor, origin: _Origin, what: str) -> None:
    """If `bad` holds anywhere, raise a DomainError naming the first such element of `t`."""
    if not bool(bad.any()):
        return
    flat = int(bad.reshape(-1).nonzero()[0, 0])
    pos = [int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape)] if t.ndim else []
    value = t.reshape(-1)[flat].item()
    row = pos[0] if origin.rows else 0
    inner = pos[1:] if origin.indices is not None else pos  # dataset items: position in the item
    held = f"holds {value} at {inner}" if inner else f"is {value}"
    raise DomainError(f"{origin.subject(f, row)} {held}, {what} {origin.declared(f)}")


def lossless(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether every value of dtype `src` is exactly a value of `dst` (a widening: bool to any number,
    u8 to f32, i32 to i64, f16 to f32...). Only such a conversion is made without being asked for."""
    if src == dst or (src == torch.bool and not dst.is_complex):
        return True
    if src.is_complex or dst.is_complex or dst == torch.bool or src == torch.bool:
        return False
    if src.is_floating_point:
        if not dst.is_floating_point:
            return False
        a, b = torch.finfo(src), torch.finfo(dst)
        return b.eps <= a.eps and b.max >= a.max and b.tiny <= a.tiny
    s = torch.iinfo(src)
    if dst.is_floating_point:  # integers up to 2 / eps are exact in a float
        return max(-s.min, s.max) <= 2 / torch.finfo(dst).eps
    d = torch.iinfo(dst)
    return d.min <= s.min and d.max >= s.max


def _to_dtype(f: FieldSpec, t: torch.Tensor, origin: _Origin, numpy: bool) -> torch.Tensor:
    """Convert to the field's dtype where no value can change (`lossless`); any other dtype is a
    ShapeError that says how to convert it, as for a function's tensor argument."""
    if lossless(t.dtype, f.dtype):
        return t if t.dtype == f.dtype else t.to(f.dtype)
    fix = (f".astype(numpy.{str(f.dtype).split('.')[1]})" if numpy else f".to({f.dtype})")
    raise ShapeError(f"{origin.field(f)}: expected dtype {dtype_name(f.dtype)}, got {dtype_name(t.dtype)}, "
                     f"which can't be converted without changing values; convert it with {fix} "
                     f"{origin.declared(f)}")


def in_bounds(t: torch.Tensor, bound: int) -> bool:
    """Every value of an Index tensor in [0, bound): one pass over the data for both ends, compared
    as plain numbers (comparing tensors costs more). Never left to torch: cross_entropy takes -100
    as "no label" and skips it silently."""
    if not t.numel():
        return True
    if type(t) is torch.Tensor and t.dtype is torch.int64 and t.is_cpu:  # faster than two new tensors
        pair, ends = getattr(_bounds_scratch, "pair", None) or _new_bounds_scratch()
        torch.aminmax(t, out=ends)
        lo, hi = pair.tolist()
        return lo >= 0 and hi < bound
    low, high = torch.aminmax(t)
    return low.item() >= 0 and high.item() < bound


_bounds_scratch = threading.local()  # .pair: each thread's own two int64s that `in_bounds` writes


def _new_bounds_scratch() -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    with torch.inference_mode(False):  # a plain tensor, written in place in or out of inference mode
        pair = torch.empty(2, dtype=torch.int64, device="cpu")
    _bounds_scratch.pair = (pair, (pair[0], pair[1]))
    return _bounds_scratch.pair


def _check_index(f: FieldSpec, t: torch.Tensor, origin: _Origin) -> None:
    bound = f.index_bound
    if bound is not None and not in_bounds(t, bound):
        label = f.bound_label
        named = (f"Index[{label}] with {label} = {bound}" if label and label != str(bound)
                 else f"Index[{bound}]")
        _refuse(f, t, (t < 0) | (t >= bound), origin, f"outside {named}")


def as_given(spec: DataSpec, record: Any, rows: int | None) -> dict[str, torch.Tensor] | None:
    """The fields as they are when nothing needs converting or refusing: a dict of exactly the
    declared fields, each a dense tensor of its dtype and shape with `rows` rows (None: as many as
    the first field has), Index values in bounds. None otherwise: then the full check converts what
    may be converted and words what is wrong. It spares a right batch the cost of the full check
    (a call from Python, and each batch a loop loads); tests/runtime/test_batch_checks.py checks
    that both ways give the same fields and the same errors."""
    if given_rows(spec, record, rows) < 0:
        return None
    return dict(record)  # a dict of its own: the caller's may change


def given_rows(spec: DataSpec, record: Any, rows: int | None) -> int:
    """How many rows `record` has if `as_given` would take it as it is (0 for a spec without fields
    and no `rows`), else -1; it copies nothing."""
    fields = spec.as_given
    if fields is None or type(record) is not dict or len(record) != len(fields):
        return -1
    for name, dtype, shape, bound in fields:  # dtypes and layouts are singletons: `is` compares them
        t = record.get(name)
        if type(t) is not torch.Tensor or t.dtype is not dtype or t.layout is not torch.strided or t.is_meta:
            return -1
        given = t.shape
        if rows is None:
            if not given:
                return -1
            rows = given[0]
        if given != (rows, *shape):  # one comparison for the rank, the rows and the rest
            return -1
        if bound is not None and not in_bounds(t, bound):
            return -1
    return 0 if rows is None else rows


def given_batch(spec: DataSpec, record: dict[str, torch.Tensor], rows: int) -> Batch:
    """The Batch `trusted_batch(spec, as_given(spec, record, None))` makes, for a record `given_rows` took
    with `rows` rows, built without the copies between (a call's short way, guards.py)."""
    batch = Batch.__new__(Batch)
    batch.__dict__.update(record)
    batch.spec, batch.size, batch.lengths = spec, rows, {}
    return batch


def _check_record(spec: DataSpec, record: Any, origin: _Origin) -> dict[str, torch.Tensor]:
    if origin.rows:
        given = as_given(spec, record, len(origin.indices) if origin.indices is not None else None)
        if given is not None:
            return given
    fields = ", ".join(f.name for f in spec.fields)
    if not isinstance(record, Mapping):
        raise ShapeError(f"{origin.record()} is a {type(record).__name__}, expected a mapping "
                         f"with the fields of {spec.name} ({fields}; declared at {spec.where})")
    extra = [key for key in record if key not in {f.name for f in spec.fields}]
    for f in spec.fields:
        if f.name not in record:
            near = [key for key in extra if isinstance(key, str) and similar(key, [f.name])]
            hint = (f"; it has `{near[0]}`, which {spec.name} does not declare: did you mean `{f.name}`?"
                    if near else "")
            raise ShapeError(f"{origin.record()} has no field `{f.name}` {origin.declared(f)}{hint}")
    if extra:
        raise ShapeError(f"{origin.record()} has a field `{extra[0]}` that {spec.name} does not "
                         f"declare (its fields: {fields}; declared at {spec.where})")
    bound: dict[str, tuple[int, str]] = {}
    out: dict[str, torch.Tensor] = {}
    for f in spec.fields:
        t = _tensor(record[f.name], f, origin)
        _check_shape(f, t, origin, bound)
        t = _to_dtype(f, t, origin, np is not None and isinstance(record[f.name], np.ndarray))
        _check_index(f, t, origin)
        out[f.name] = t
    return out


def check_item(spec: DataSpec, item: Any, index: int) -> dict[str, torch.Tensor]:
    """One dataset item (a mapping of field -> array), checked and converted."""
    return _check_record(spec, item, _Origin(index=index))


def check_batch(spec: DataSpec, fields: Mapping[str, Any], indices: Sequence[int] | torch.Tensor
                ) -> dict[str, torch.Tensor]:
    """Stacked fields `[n, ...]` of the dataset items `indices`, checked all at once."""
    return _check_record(spec, fields, _Origin(indices=indices))


def batch_from_python(spec: DataSpec, value: Any, where: str) -> Batch:
    """A batch handed in from Python: a Batch of this type, or a dict of field tensors."""
    if isinstance(value, Batch):
        if value.spec != spec:
            raise ShapeError(f"expected a batch of {spec.name} (declared at {spec.where}) for "
                             f"{where}, got a batch of {value.spec.name}")
        return value
    fields = _check_record(spec, value, _Origin(where=where))
    batch = trusted_batch(spec, fields)
    if batch.size == 0:
        raise ShapeError(f"the batch of {spec.name} for {where} is empty")
    return batch


def _stack(spec: DataSpec, items: list[dict[str, torch.Tensor]], indices: Sequence[int]
           ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Stack checked items; axes of a generic dim (`tokens: [n]`) are padded with zeros to the
    batch's longest item, and each item's own size is kept in the lengths by the dim's name."""
    sizes: dict[str, list[int]] = {}
    for f in spec.fields:
        for k, (label, size) in enumerate(f.dims):
            if size is None and label not in sizes:
                sizes[label] = [int(item[f.name].shape[k]) for item in items]
    longest = {label: max(ns, default=0) for label, ns in sizes.items()}
    out = {}
    for f in spec.fields:
        if not items:  # a worker's empty part of a batch smaller than the workers: no rows, same axes
            out[f.name] = torch.zeros((0, *(longest[label] if size is None else size for label, size in f.dims)),
                                      dtype=f.dtype)
            continue
        ts = [_pad(item[f.name], f, longest) for item in items]
        for t, i in zip(ts, indices):
            if t.shape != ts[0].shape:  # fixed dims were checked per item; this is our own bug
                raise ShapeError(f"item {i} of the dataset: field `{f.name}` has shape "
                                 f"{shape_text(t.shape)}, but item {indices[0]} of the same batch "
                                 f"has {shape_text(ts[0].shape)} (declared at {f.where})")
        out[f.name] = torch.stack(ts)
    return out, {label: torch.tensor(ns, dtype=torch.int64) for label, ns in sizes.items()}


def _pad(t: torch.Tensor, f: FieldSpec, longest: dict[str, int], lead: int = 0) -> torch.Tensor:
    """`t` (one item, or `lead` = 1 for stacked items) padded with zeros to `longest` along each
    generic dim."""
    widths: list[int] = []
    for k in range(len(f.dims) - 1, -1, -1):  # F.pad takes the last axis first
        label, size = f.dims[k]
        widths += [0, longest[label] - t.shape[lead + k] if size is None else 0]
    return torch.nn.functional.pad(t, widths) if any(widths) else t


def generic_dims(spec: DataSpec) -> list[str]:
    """The generic dims of a data type's fields (`n` of `tokens: [n]`), in order of first use."""
    return list(dict.fromkeys(label for f in spec.fields for label, size in f.dims if size is None))


def padded_sizes(batch: Batch) -> dict[str, int]:
    """The batch's size along each generic dim of its fields (what its items are padded to)."""
    sizes: dict[str, int] = {}
    for f, t in zip(batch.spec.fields, batch_fields(batch).values()):
        for k, (label, size) in enumerate(f.dims):
            if size is None:
                sizes.setdefault(label, int(t.shape[1 + k]))
    return sizes


def pad_batch(batch: Batch, longest: Mapping[str, int]) -> Batch:
    """A worker's part padded further, to the whole batch's longest item along each generic dim, as
    the controller would pad the whole batch; each item's own lengths are unchanged."""
    if padded_sizes(batch) == dict(longest):
        return batch
    fields = {f.name: _pad(t, f, dict(longest), lead=1)
              for f, t in zip(batch.spec.fields, batch_fields(batch).values())}
    return trusted_batch(batch.spec, fields, batch.lengths)


def load_items(base: Any, indices: Sequence[int] | torch.Tensor, spec: DataSpec
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A batch's fields, and the lengths of its items along each generic dim (if padded). `indices` is
    a tensor only for a TensorDataset, whose batches are sliced from the loop's order."""
    if isinstance(indices, torch.Tensor):
        assert isinstance(base, TensorDataset)
        return check_batch(spec, base.__getitems__(indices), indices), {}
    getitems = getattr(base, "__getitems__", None)
    if getitems is None:
        items = [base[i] for i in indices]
    else:
        got = getitems(indices)
        if isinstance(got, Mapping):
            return check_batch(spec, got, indices), {}
        items = list(got)
        if len(items) != len(indices):
            raise ShapeError(f"{type(base).__name__}.__getitems__ returned {len(items)} items "
                             f"for {len(indices)} indices")
    checked = [check_item(spec, item, i) for item, i in zip(items, indices)]
    return _stack(spec, checked, indices)


def int_arg(value: Any, op: str, name: str) -> int:
    """`value` as an int; a TypeError naming `op`'s `name` for anything else, bools included (also
    runtime/loops.py's `shuffle` and `batches`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


class TensorDataset:
    """A dataset of named tensors sharing their leading length: TensorDataset(img=X, label=Y)."""

    def __init__(self, **fields: Any) -> None:
        if not fields:
            raise ShapeError("TensorDataset needs at least one field")
        self.fields: dict[str, torch.Tensor] = {}
        for name, value in fields.items():
            try:
                t = _as_tensor(value)
            except _CONVERSION_ERRORS as e:
                raise ShapeError(f"TensorDataset: field `{name}` is a {type(value).__name__} "
                                 f"that is not an array of numbers ({e})") from None
            if t.ndim == 0:
                raise ShapeError(f"TensorDataset: field `{name}` is a scalar, expected one row "
                                 f"per item")
            self.fields[name] = t
        first, *rest = self.fields.items()
        for name, t in rest:
            if len(t) != len(first[1]):
                raise ShapeError(f"TensorDataset: field `{name}` has {len(t)} rows, but "
                                 f"`{first[0]}` has {len(first[1])}; fields need the same length")
        self._length = len(first[1])
        self._fits_as_given: Any = None  # the spec and the fields' versions checked whole (fits_as_given)

    def __len__(self) -> int:
        return self._length

    @property
    def home(self) -> torch.device | None:
        """The device every field is on, or None where they are on different ones."""
        devices = {t.device for t in self.fields.values()}
        return devices.pop() if len(devices) == 1 else None

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = int_arg(i, "TensorDataset[i]", "i")
        if not -self._length <= i < self._length:
            raise IndexError(f"index {i} is out of range for a dataset of {self._length} items")
        return {name: t[i] for name, t in self.fields.items()}

    def fits_as_given(self, spec: DataSpec) -> bool:
        """Whether every item fits `spec` as it is (dtypes, shapes, bounds: `given_rows`), so that any
        batch gathered from the fields fits too. Remembered until a field is replaced or changed in
        place (a tensor's version counts its in-place changes)."""
        state = (spec, tuple((name, id(t), t._version) for name, t in self.fields.items()))
        if self._fits_as_given != state:
            if given_rows(spec, dict(self.fields), None) != self._length:
                return False
            self._fits_as_given = state
        return True

    def __getitems__(self, indices: Sequence[int] | torch.Tensor) -> dict[str, torch.Tensor]:
        idx = indices if isinstance(indices, torch.Tensor) else torch.as_tensor(indices, dtype=torch.long)
        by_device: dict[torch.device, torch.Tensor] = {}
        return {name: t.index_select(0, by_device.setdefault(t.device, idx.to(t.device)))
                for name, t in self.fields.items()}
