"""Models at run time: the specs the code generator emits, and `Model`, which holds the tensors.

A model's params, buffers and sub-models are plain instance attributes under a prefix (`m._m_w1`,
`m._m_enc._m_w`), so generated code reads the live tensors at the cost of one attribute lookup.
From Python, `m.w1` is a detached copy, as it is on several devices, where the tensors stay on the
workers: editing it never changes the model. Everything that walks a model (params, names, state)
goes by the spec's declaration order, depth-first into sub-models.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from shapescript.dtypes import ELEMENTS
from shapescript.errors import DeviceError, DomainError, ShapeError
from shapescript.inits import INITS  # an init not there is a code generator bug
from shapescript.names import MEMBER_PREFIX, MODEL_RESERVED, is_reserved, reserved_text
from shapescript.runtime.steps import between_steps

# torch's dtypes as messages name them: the language's own, and a few more a user may pass in.
_SS_DTYPES: dict[torch.dtype, str] = {
    **{getattr(torch, e.torch): name for name, e in ELEMENTS.items()},
    torch.int8: "i8", torch.int16: "i16", torch.uint8: "u8",
}



def dtype_name(dtype: torch.dtype) -> str:
    """The .ss spelling of a dtype: f32, bf16, i64..."""
    return _SS_DTYPES.get(dtype, str(dtype).removeprefix("torch."))


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
        if self.init not in INITS:
            raise ValueError(f"{self.where}: member `{self.name}` has unknown init {self.init!r}")
        unknown = {k for k, _ in self.init_args} - INITS[self.init].keys()
        if unknown:
            raise ValueError(f"{self.where}: {self.init}() takes no argument {sorted(unknown)}")
        if self.kind == "param" and not self.dtype.is_floating_point:
            raise ValueError(f"{self.where}: param `{self.name}` must have a float dtype to be "
                             f"trained, not {dtype_name(self.dtype)}")
        if self.init in ("normal", "uniform") and not self.dtype.is_floating_point:
            raise ValueError(f"{self.where}: {self.init}() cannot fill `{self.name}` of dtype "
                             f"{dtype_name(self.dtype)}")


# A worker's choice of the part of a param it keeps (runtime/sharding.py): (the model declaring it,
# the param, its whole value) -> the part.
Keep = Callable[["ModelSpec", ParamSpec, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SubSpec:
    name: str
    model: ModelSpec
    where: str
    count: int | None = None  # a stack of `count` models, as `blocks: [L] Block`


@dataclass(frozen=True)
class ModelSpec:
    name: str  # "Mlp", or a generic model's use with its dims: "Linear[D C]"
    members: tuple[ParamSpec | SubSpec, ...]  # declaration order
    where: str
    family: str = ""  # a generic model's use: the declared model's name ("Linear")

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for member in self.members:
            if member.name in seen:
                raise ValueError(f"{member.where}: `{member.name}` is declared twice in "
                                 f"{self.name}")
            if is_reserved(member.name, MODEL_RESERVED):  # the checker refuses it first (E0207)
                raise ValueError(f"{member.where}: `{member.name}` is reserved and cannot name a "
                                 f"member of model {self.name}: {reserved_text(MODEL_RESERVED)}")
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
    args = {**INITS[leaf.init], **dict(leaf.init_args)}
    if leaf.init == "zeros":
        return torch.zeros(leaf.shape, dtype=leaf.dtype)
    if leaf.init == "ones":
        return torch.ones(leaf.shape, dtype=leaf.dtype)
    t = torch.empty(leaf.shape, dtype=leaf.dtype)
    if leaf.init == "normal":
        return t.normal_(args["mean"], args["std"], generator=g)
    return t.uniform_(args["low"], args["high"], generator=g)


def require_visible(indices: tuple[int, ...], asked: str, what: str) -> None:
    """Raise DeviceError unless the CUDA devices `indices` (written `asked`, as "cuda[0 1 2]") are
    visible: torch's own error ("Torch not compiled with CUDA enabled", an invalid device ordinal)
    doesn't say what to do."""
    visible = torch.cuda.device_count()  # 0 without a GPU, or with a torch built without CUDA
    if all(i < visible for i in indices):
        return
    seen = ("no CUDA device is visible" if visible == 0 else
            f"only {visible} CUDA device{'s are' if visible > 1 else ' is'} visible "
            f"(cuda[{' '.join(map(str, range(visible)))}])")
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        seen += f" with CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r}"
    elif visible == 0 and not torch.backends.cuda.is_built():
        seen += " (this torch was built without CUDA)"
    plain = "cpu" if len(indices) == 1 else f"cpu[{' '.join(map(str, range(len(indices))))}]"
    raise DeviceError(f"{what} on {asked}: {seen}; run the program on the CPU with devices=\"{plain}\" "
                      f"(--devices '{plain}'), or on the CUDA devices there are")


def _bytes_text(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} YB"


def _leaf_bytes(spec: ModelSpec, prefix: str = "") -> tuple[int, tuple[int, str, ParamSpec] | None]:
    """The bytes a model's params and buffers take, and its biggest one (bytes, dotted name, spec),
    counted without walking each model of a stack."""
    total, biggest = 0, None
    for member in spec.members:
        if isinstance(member, SubSpec):
            label = f"{prefix}{member.name}.0." if member.count is not None else f"{prefix}{member.name}."
            sub_total, sub_biggest = _leaf_bytes(member.model, label)
            total += sub_total * (member.count if member.count is not None else 1)
            found = sub_biggest
        else:
            size = math.prod(member.shape) * member.dtype.itemsize
            total += size
            found = (size, prefix + member.name, member)
        if found is not None and (biggest is None or found[0] > biggest[0]):
            biggest = found
    return total, biggest


def _memory_bytes(device: torch.device) -> tuple[int, str] | None:
    """The memory a model on `device` may take now, and what it is; None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], f"free on {device}"
    if device.type != "cpu":
        return None
    try:  # MemAvailable: what the kernel can give without swapping, page cache included
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available in this machine's memory"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
        return int(psutil.virtual_memory().available), "available in this machine's memory"
    except ImportError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's memory"
    except (ValueError, OSError, AttributeError):
        return None


def _check_fits(spec: ModelSpec, device: torch.device) -> None:
    """A model too big for the memory is refused with its size, before anything is allocated (torch
    would fail with an overflow, or the kernel would kill the process as the pages fill)."""
    total, biggest = _leaf_bytes(spec)
    if total < 1 << 26 or biggest is None:  # under 64 MB: not worth a look at the memory
        return
    size, name, leaf = biggest
    member = (f"`{name}` is {type_text(leaf.shape, leaf.dtype)}, {_bytes_text(size)} (declared at "
              f"{leaf.where})")
    memory = _memory_bytes(device)
    if memory is not None and total > memory[0]:
        raise DeviceError(f"{spec.name}.init: the model needs {_bytes_text(total)}, more than the "
                          f"{_bytes_text(memory[0])} {memory[1]}; its biggest member {member}")
    cpu = _memory_bytes(torch.device("cpu")) if device.type != "cpu" else None
    if cpu is not None and size > cpu[0]:  # each member is drawn on the CPU, then moved
        raise DeviceError(f"{spec.name}.init: {member}, drawn on the CPU first: more than the "
                          f"{_bytes_text(cpu[0])} {cpu[1]}")


class Model:
    """A model's tensors. Member `w` is the attribute `_m_w`, read by generated code; `m.w` from
    Python is a detached copy of it (a sub-model, or a stack's tuple, as it is), through a property
    of the spec's own subclass (`model_class`). `spec` says what they are. Every attribute of its
    own is in names.MODEL_RESERVED or starts with `_`."""

    spec: ModelSpec
    _params: list[torch.Tensor]
    is_remote = False  # a RemoteModel's is True

    @classmethod
    def init(cls, spec: ModelSpec, seed: int, device: str | torch.device = "cpu",
             keep: Keep | None = None) -> Model:
        """Deterministic: one CPU generator seeded with `seed` draws every member in order. `keep`
        (a worker's, with the layout options): the part of each param it keeps, given the model
        declaring it, the param and the whole drawn value, so that no more than one param is ever
        whole at once."""
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"{spec.name}.init: seed must be an int, got {type(seed).__name__} "
                            f"{seed!r}")
        try:
            where = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise DomainError(f"{spec.name}.init: {device!r} is not a device ({e})") from None
        if where.type == "cuda":
            require_visible((where.index or 0,), str(where), f"{spec.name}.init")
        if keep is None:  # a worker keeping parts never holds the whole model, only one param at a time
            _check_fits(spec, where)
        return cls._build(spec, torch.Generator().manual_seed(int(seed)), where, keep)

    @classmethod
    def _build(cls, spec: ModelSpec, g: torch.Generator, device: torch.device, keep: Keep | None = None) -> Model:
        kind = model_class(spec)
        m = kind.__new__(kind)
        values: dict[str, object] = {}
        params: list[torch.Tensor] = []
        for member in spec.members:
            if isinstance(member, SubSpec):
                # A stack is a tuple of models, drawn one after another from the same generator.
                subs = tuple(Model._build(member.model, g, device, keep) for _ in range(member.count or 1))
                values[live_name(member.name)] = subs if member.count is not None else subs[0]
                for sub in subs:
                    params.extend(sub._params)
                continue
            t = _draw(member, g).to(device)
            if member.kind == "param" and keep is not None:
                t = keep(spec, member, t)
            if member.kind == "param":
                t.requires_grad_(True)
                params.append(t)
            values[live_name(member.name)] = t
        m.__dict__.update(values, spec=spec, _params=params)
        return m

    def params(self) -> list[torch.Tensor]:
        """The trained params, declaration order depth-first (the same list every call): the
        model's own tensors, which its optimizer holds and updates in place, not copies as a field
        read from Python is, so changing one in place (under torch.no_grad()) changes the model."""
        return self._params

    def named_params(self) -> list[tuple[str, torch.Tensor]]:
        return list(zip(param_names(self.spec), self._params))

    def _leaf(self, dotted: str) -> torch.Tensor:
        obj: object = self
        for part in dotted.split("."):
            obj = obj[int(part)] if isinstance(obj, tuple) else obj.__dict__[live_name(part)]
        assert isinstance(obj, torch.Tensor)
        return obj

    def __setattr__(self, name: str, value: object) -> None:
        refuse_change(self, name)

    def __reduce__(self) -> tuple[Any, ...]:
        # The class is made per spec, so pickle and deepcopy make it again from the spec.
        return _rebuild, (self.spec, dict(self.__dict__))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Params and buffers by dotted name, as detached copies."""
        with between_steps():
            return {name: self._leaf(name).detach().clone() for name, _ in leaves(self.spec)}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Strict: checks every name, shape and dtype first, then copies in place."""
        check_state(self.spec, state, "load_state_dict")
        copy_state(self, state)

    def __repr__(self) -> str:
        parts = []
        for member in self.spec.members:
            value = self.__dict__[live_name(member.name)]
            if isinstance(member, SubSpec) and member.count is not None:
                parts.append(f"{member.name}: [{member.count}] {member.model.name}")
            elif isinstance(member, SubSpec):
                parts.append(f"{member.name}: {value!r}")
            else:
                extra = " buffer" if member.kind == "buffer" else ""
                parts.append(f"{member.name}: {type_text(member.shape, member.dtype)}{extra}")
        return f"{self.spec.name}({', '.join(parts)})"


@functools.cache
def model_class(spec: ModelSpec) -> type[Model]:
    """Model with a property per member, named after the spec: `m.w` from Python is a copy of the
    live `m._m_w`, so that editing it changes nothing, on one device as on several. Properties
    rather than `__getattr__`, which would slow every attribute read of generated code."""
    return type(spec.name, (Model,), {m.name: _member_property(m.name) for m in spec.members})


# Asked, when set, before a member of a model is read from Python (`m.w`, `m.enc`): read_check(spec,
# member) raises to refuse the read. A notebook refuses a model whose type a later cell reshaped
# (notebook/session.py), as a call refuses it.
read_check: Callable[[ModelSpec, str], None] | None = None


def _member_property(name: str) -> property:
    live = live_name(name)

    def read(self: Model) -> Any:
        if read_check is not None:
            read_check(self.spec, name)
        value = self.__dict__[live]
        if not isinstance(value, torch.Tensor):
            return value
        with between_steps():  # a background run's step changes it in place
            return value.detach().clone()

    return property(read, doc=f"a detached copy of `{name}` (a sub-model as it is)")


def _rebuild(spec: ModelSpec, state: dict[str, Any]) -> Model:
    kind = model_class(spec)
    m = kind.__new__(kind)
    m.__dict__.update({sys.intern(k): v for k, v in state.items()})
    return m


def live_name(member: str) -> str:
    """The attribute that holds a member's live tensor: `_m_w` for `w`. Interned, as the names in
    generated code are, so that their reads take CPython's fastest path (which compares keys by
    identity); a name made by `+` alone would make each read twice as slow."""
    return sys.intern(MEMBER_PREFIX + member)


def refuse_change(model: object, name: str) -> None:
    """A model's `__setattr__`, on one device as on several: its tensors change only in ShapeScript."""
    raise AttributeError(f"a model can't be changed from Python (setting `{name}`): a ShapeScript function "
                         f"that takes it as `mut` changes it, and ss.restore loads a checkpoint into it")


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


def members_text(spec: ModelSpec) -> str:
    """`w1: [784, 256] f32, bn.mean: [64] f32 buffer`: every leaf of a model, from its spec."""
    return ", ".join(f"{name}: {type_text(leaf.shape, leaf.dtype)}{' buffer' if leaf.kind == 'buffer' else ''}"
                     for name, leaf in leaves(spec))
