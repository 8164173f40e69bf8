"""Models at run time: the specs the code generator emits, and `Model`, which holds the tensors.

A model's params, buffers and sub-models are plain instance attributes (`m.w1`, `m.enc.w`), so
generated code reads them at the cost of one attribute lookup. Everything that walks a model
(params, names, state) goes by the spec's declaration order, depth-first into sub-models.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from shapescript.errors import DomainError, ShapeError

_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
    torch.uint8: "u8", torch.bool: "bool",
}

# Each init's arguments and their defaults; an argument not listed is a code generator bug.
_INIT_DEFAULTS: dict[str, dict[str, float]] = {
    "normal": {"mean": 0.0, "std": 1.0},
    "uniform": {"low": 0.0, "high": 1.0},
    "zeros": {},
    "ones": {},
}


def dtype_name(dtype: torch.dtype) -> str:
    """The .ss spelling of a dtype: f32, bf16, i64..."""
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def shape_text(shape: tuple[int, ...] | torch.Size) -> str:
    return "[" + ", ".join(str(int(n)) for n in shape) + "]"


def type_text(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> str:
    return f"{shape_text(shape)} {dtype_name(dtype)}"


@dataclass(frozen=True)
class ParamSpec:
    name: str
    kind: str  # "param" (trained) | "buffer" (not trained)
    shape: tuple[int, ...]
    dtype: torch.dtype
    init: str  # "normal" | "uniform" | "zeros" | "ones"
    init_args: tuple[tuple[str, float], ...]
    where: str  # the declaration, "mlp.ss:9:5"

    def __post_init__(self) -> None:
        # These are emitted by the code generator, so a bad one is our bug: fail at import, loudly.
        if self.kind not in ("param", "buffer"):
            raise ValueError(f"{self.where}: member `{self.name}` has unknown kind {self.kind!r}")
        if self.init not in _INIT_DEFAULTS:
            raise ValueError(f"{self.where}: member `{self.name}` has unknown init {self.init!r}")
        unknown = {k for k, _ in self.init_args} - _INIT_DEFAULTS[self.init].keys()
        if unknown:
            raise ValueError(f"{self.where}: {self.init}() takes no argument {sorted(unknown)}")
        if self.kind == "param" and not self.dtype.is_floating_point:
            raise ValueError(f"{self.where}: param `{self.name}` must have a float dtype to be "
                             f"trained, not {dtype_name(self.dtype)}")
        if self.init in ("normal", "uniform") and not self.dtype.is_floating_point:
            raise ValueError(f"{self.where}: {self.init}() cannot fill `{self.name}` of dtype "
                             f"{dtype_name(self.dtype)}")


@dataclass(frozen=True)
class SubSpec:
    name: str
    model: "ModelSpec"
    where: str
    count: int | None = None  # a stack of `count` models, as `blocks: [L] Block`


@dataclass(frozen=True)
class ModelSpec:
    name: str
    members: tuple[ParamSpec | SubSpec, ...]  # declaration order
    where: str

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for member in self.members:
            if member.name in seen:
                raise ValueError(f"{member.where}: `{member.name}` is declared twice in "
                                 f"{self.name}")
            if member.name in _RESERVED:
                # An attribute of that name would hide a method of Model.
                raise ValueError(f"{member.where}: `{member.name}` is reserved and cannot name a "
                                 f"member of model {self.name}")
            seen.add(member.name)


def leaves(spec: ModelSpec, prefix: str = "") -> Iterator[tuple[str, ParamSpec]]:
    """Every param and buffer with its dotted name, in declaration order, depth-first."""
    for member in spec.members:
        if isinstance(member, SubSpec) and member.count is not None:
            for k in range(member.count):
                yield from leaves(member.model, f"{prefix}{member.name}.{k}.")
        elif isinstance(member, SubSpec):
            yield from leaves(member.model, f"{prefix}{member.name}.")
        else:
            yield prefix + member.name, member


@functools.cache
def param_names(spec: ModelSpec) -> tuple[str, ...]:
    """The dotted names of the trained params, aligned with `Model.params()`."""
    return tuple(name for name, leaf in leaves(spec) if leaf.kind == "param")


def _draw(leaf: ParamSpec, g: torch.Generator) -> torch.Tensor:
    args = {**_INIT_DEFAULTS[leaf.init], **dict(leaf.init_args)}
    if leaf.init == "zeros":
        return torch.zeros(leaf.shape, dtype=leaf.dtype)
    if leaf.init == "ones":
        return torch.ones(leaf.shape, dtype=leaf.dtype)
    t = torch.empty(leaf.shape, dtype=leaf.dtype)
    if leaf.init == "normal":
        return t.normal_(args["mean"], args["std"], generator=g)
    return t.uniform_(args["low"], args["high"], generator=g)


class Model:
    """A model's tensors. Members are plain attributes; `spec` says what they are."""

    spec: ModelSpec
    _params: list[torch.Tensor]

    @classmethod
    def init(cls, spec: ModelSpec, seed: int, device: str | torch.device = "cpu") -> "Model":
        """Deterministic: one CPU generator seeded with `seed` draws every member in order."""
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"{spec.name}.init: seed must be an int, got {type(seed).__name__} "
                            f"{seed!r}")
        try:
            where = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise DomainError(f"{spec.name}.init: {device!r} is not a device ({e})") from None
        return cls._build(spec, torch.Generator().manual_seed(int(seed)), where)

    @classmethod
    def _build(cls, spec: ModelSpec, g: torch.Generator, device: torch.device) -> "Model":
        m = cls.__new__(cls)
        values: dict[str, object] = {}
        params: list[torch.Tensor] = []
        for member in spec.members:
            if isinstance(member, SubSpec):
                # A stack is a tuple of models, drawn one after another from the same generator.
                subs = tuple(Model._build(member.model, g, device) for _ in range(member.count or 1))
                values[member.name] = subs if member.count is not None else subs[0]
                for sub in subs:
                    params.extend(sub._params)
                continue
            t = _draw(member, g).to(device)
            if member.kind == "param":
                t.requires_grad_(True)
                params.append(t)
            values[member.name] = t
        m.__dict__.update(values, spec=spec, _params=params)
        return m

    def params(self) -> list[torch.Tensor]:
        """The trained params, declaration order depth-first (the same list every call)."""
        return self._params

    def named_params(self) -> list[tuple[str, torch.Tensor]]:
        return list(zip(param_names(self.spec), self._params))

    def _leaf(self, dotted: str) -> torch.Tensor:
        obj: object = self
        for part in dotted.split("."):
            obj = obj[int(part)] if isinstance(obj, tuple) else obj.__dict__[part]
        assert isinstance(obj, torch.Tensor)
        return obj

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Params and buffers by dotted name, as detached copies."""
        return {name: self._leaf(name).detach().clone() for name, _ in leaves(self.spec)}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Strict: checks every name, shape and dtype first, then copies in place."""
        check_state(self.spec, state, "load_state_dict")
        copy_state(self, state)

    def __repr__(self) -> str:
        parts = []
        for member in self.spec.members:
            value = self.__dict__[member.name]
            if isinstance(member, SubSpec) and member.count is not None:
                parts.append(f"{member.name}: [{member.count}] {member.model.name}")
            elif isinstance(member, SubSpec):
                parts.append(f"{member.name}: {value!r}")
            else:
                extra = " buffer" if member.kind == "buffer" else ""
                parts.append(f"{member.name}: {type_text(member.shape, member.dtype)}{extra}")
        return f"{self.spec.name}({', '.join(parts)})"

    def _repr_html_(self) -> str | None:
        """A notebook's display: a table of the params and buffers (shapescript/notebook/models.py)."""
        try:
            from shapescript.notebook.models import model_html  # plain HTML; imports no IPython
        except ImportError:  # inlined in a standalone build, without shapescript: the text repr
            return None
        return model_html(self)


# Names a member may not take, since an instance attribute would hide them.
_RESERVED = frozenset(n for n in dir(Model) if not n.startswith("__")) | {"spec", "_params"}


def check_state(spec: ModelSpec, state: Mapping[str, object], source: str) -> None:
    """Raise one ShapeError listing every way `state` does not fit `spec`; change nothing."""
    if not isinstance(state, Mapping):
        raise ShapeError(f"{source}: expected a dict of tensors for {spec.name}, got "
                         f"{type(state).__name__}")
    problems: list[str] = []
    expected = dict(leaves(spec))
    for name, leaf in expected.items():
        want = type_text(leaf.shape, leaf.dtype)
        if name not in state:
            problems.append(f"`{name}` is missing, expected {want} (declared at {leaf.where})")
            continue
        value = state[name]
        if not isinstance(value, torch.Tensor):
            problems.append(f"`{name}` is a {type(value).__name__}, expected a tensor {want} "
                            f"(declared at {leaf.where})")
        elif tuple(value.shape) != leaf.shape or value.dtype != leaf.dtype:
            problems.append(f"`{name}` is {type_text(value.shape, value.dtype)}, expected {want} "
                            f"(declared at {leaf.where})")
    for name in state:
        if name not in expected:
            problems.append(f"`{name}` is not a member of {spec.name}")
    if len(problems) == 1:
        raise ShapeError(f"{source}: {problems[0]}")
    if problems:
        lines = "\n".join("  " + p for p in problems)
        raise ShapeError(f"{source}: the state does not fit {spec.name} (declared at "
                         f"{spec.where}):\n{lines}")


def copy_state(model: Model, state: Mapping[str, torch.Tensor]) -> None:
    """Copy a state already passed by `check_state` into the model's own tensors."""
    with torch.no_grad():
        for name, _ in leaves(model.spec):
            model._leaf(name).copy_(state[name])
