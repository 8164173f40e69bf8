"""`ss.load_weights`: a model's params and buffers from weights in another project's names and layout
(Hugging Face's GPT-2, nanoGPT, any PyTorch module's state_dict), through a declared name map.

The source is a .safetensors file, a file of `torch.save` read with `torch.load(weights_only=True)`
(never a pickle's code), a dict of tensors, or an `nn.Module`. `names` maps each of the model's
dotted names to the source's, with `{i}`-style fields for stacks; `transpose` says which source
tensors are stored the other way round ([out, in], as nn.Linear keeps its weight, where `x @ w`
reads [in out]). Everything is checked before the model changes: every param and buffer read
exactly once (or left as it is, `keep`), every shape and dtype, every source tensor read (or
`ignore`d, or `strict=False`); every problem is listed in one ShapeError. Then the model takes them
all at once through its `load_state_dict`, on one device as on several.

A front end: it reads the run time's models and never the compiler.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from shapescript.errors import ShapeError
from shapescript.names import similar
from shapescript.runtime.model import Model, ModelSpec, leaves, shape_text, type_text
from shapescript.runtime.steps import between_steps

# A field of a pattern, `{i}`: one part of a dotted name (a stack's index, a member's name).
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

Source = str | os.PathLike[str] | Mapping[str, torch.Tensor] | torch.nn.Module


@dataclass(frozen=True)
class WeightsReport:
    """What `load_weights` did: the source name each model name was loaded from (model order), the
    model names whose source was transposed or cast to the model's dtype, those kept as they were,
    and the source names nothing read (`ignore`d, or extra with `strict=False`)."""

    source: str
    model: str
    loaded: dict[str, str]
    transposed: tuple[str, ...]
    cast: tuple[str, ...]
    kept: tuple[str, ...]
    unused: tuple[str, ...]

    def __str__(self) -> str:
        parts = [f"loaded {len(self.loaded)} tensors of {self.model} from {self.source}"]
        if self.transposed:
            parts.append(f"{len(self.transposed)} transposed")
        if self.cast:
            parts.append(f"{len(self.cast)} cast")
        if self.kept:
            parts.append(f"kept {len(self.kept)}: {', '.join(self.kept)}")
        if self.unused:
            parts.append(f"{len(self.unused)} unused: {', '.join(self.unused)}")
        return "; ".join(parts)


class _Pattern:
    """A dotted name with fields, `h.{i}.attn.c_attn`: each field matches one part of a name (no
    dots); a field written twice matches the same text both times."""

    def __init__(self, text: object, what: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"load_weights: {what} must be a str, not {type(text).__name__} {text!r}")
        self.text = text
        self.fields: list[str] = []
        regex, at = "", 0
        for m in _FIELD.finditer(text):
            regex += re.escape(text[at:m.start()])
            name = m.group(1)
            regex += f"(?P={name})" if name in self.fields else f"(?P<{name}>[^.]+)"
            if name not in self.fields:
                self.fields.append(name)
            at = m.end()
        regex += re.escape(text[at:])
        if any(brace in _FIELD.sub("", text) for brace in "{}"):
            raise ShapeError(f"load_weights: {what} `{text}` has a brace that is no field: a field is a "
                             f"name in braces, `{{i}}`, standing for one part of a dotted name")
        self.regex = re.compile(regex)

    def match(self, name: str) -> dict[str, str] | None:
        m = self.regex.fullmatch(name)
        return m.groupdict() if m is not None else None

    def fill(self, values: Mapping[str, str]) -> str:
        return _FIELD.sub(lambda m: values[m.group(1)], self.text)

    def nearest(self, names: Iterable[str]) -> str:
        """'did you mean' the name among `names` nearest this pattern, each stack's index written as
        this pattern's first field (`h.{i}.attn.c_attn`); '' if none is near."""
        field = "{" + (self.fields[0] if self.fields else "i") + "}"
        general = [".".join(field if part.isdigit() else part for part in n.split(".")) for n in names]
        hint = similar(self.text, general)
        return f": {hint}" if hint else ""


def _patterns(given: object, what: str) -> list[_Pattern]:
    if isinstance(given, str):
        given = [given]
    if not isinstance(given, Iterable):
        raise TypeError(f"load_weights: {what}= takes a list of names or patterns, not {type(given).__name__}")
    return [_Pattern(p, f"{what}= entry") for p in given]


def _name_map(names: object) -> list[tuple[_Pattern, _Pattern]] | None:
    """`names` as (model pattern, source pattern) pairs; None: each name is the source's own."""
    if names is None:
        return None
    if not isinstance(names, Mapping):
        raise TypeError(f"load_weights: names= takes a dict from the model's names to the source's, not "
                        f"{type(names).__name__}")
    pairs = []
    for key, value in names.items():
        ours, theirs = _Pattern(key, "a key of names="), _Pattern(value, f"names=[{key!r}]")
        unknown = [f for f in theirs.fields if f not in ours.fields]
        if unknown:
            raise ShapeError(f"load_weights: names= maps `{key}` to `{value}`, whose field `{{{unknown[0]}}}` "
                             f"is not in `{key}`: each field of a source name is filled from the model's name")
        pairs.append((ours, theirs))
    return pairs


class _Tensors:
    """A source's tensors by name, read when first asked for (a safetensors file's lazily)."""

    def __init__(self, label: str, names: list[str], get: Callable[[str], torch.Tensor]) -> None:
        self.label, self.names, self._get = label, names, get
        self._known = set(names)

    def __contains__(self, name: str) -> bool:
        return name in self._known

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._get(name)


def _checked_dict(state: Mapping[Any, Any], label: str) -> _Tensors:
    bad = [f"`{k}`: {type(v).__name__}" for k, v in state.items()
           if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ShapeError(f"load_weights: {label} holds more than tensors by name ({shown}); a checkpoint that "
                         f"keeps its weights under one key, as nanoGPT's ckpt.pt keeps them under 'model', "
                         f"is loaded with that dict itself: torch.load(path, weights_only=True)['model']")
    return _Tensors(label, list(state), lambda name: state[name].detach())


def _kind(path: str) -> str:
    """"safetensors" (its header's size in 8 bytes, then the JSON header), "torch" (torch.save's zip
    file, or a pickle as older torch.save wrote), or "" (neither)."""
    with open(path, "rb") as f:
        head = f.read(9)
    if path.endswith(".safetensors") or head[8:9] == b"{":
        return "safetensors"
    return "torch" if head.startswith((b"PK\x03\x04", b"\x80")) else ""


@contextlib.contextmanager
def _opened(source: object) -> Iterator[_Tensors]:
    if isinstance(source, torch.nn.Module):
        yield _checked_dict(source.state_dict(), f"the {type(source).__name__}'s state_dict()")
        return
    if isinstance(source, Mapping):
        yield _checked_dict(source, "the state dict")
        return
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"load_weights: the source is a path (.safetensors, or a file of torch.save), a dict "
                        f"of tensors or an nn.Module, not {type(source).__name__}")
    path = os.fspath(source)
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, f"load_weights: {path} is a folder, not a file of weights", path)
    if not os.path.isfile(path):
        raise FileNotFoundError(errno.ENOENT, f"load_weights: no file {path}", path)
    kind = _kind(path)
    if kind == "safetensors":
        from safetensors import SafetensorError, safe_open
        try:
            with safe_open(path, framework="pt") as f:
                yield _Tensors(path, list(f.keys()), f.get_tensor)
        except SafetensorError as e:
            raise ShapeError(f"load_weights: {path} is not a readable safetensors file ({e})") from None
        return
    if not kind:
        raise ShapeError(f"load_weights: {path} is neither a safetensors file nor one of torch.save")
    try:  # weights_only: tensors, dicts, lists and numbers; a pickle naming any code is refused
        with warnings.catch_warnings():  # a pickle not of torch.save's protocol: refused below if need be
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        why = next((line.strip() for line in str(e).splitlines() if "Unsupported" in line), str(e).splitlines()[0])
        raise ShapeError(f"load_weights: {path} holds more than weights, and is not read: torch.load with "
                         f"weights_only=True refused it ({why}); load_weights never runs a pickle's code") from None
    except (RuntimeError, EOFError, ValueError) as e:
        raise ShapeError(f"load_weights: {path} is neither a safetensors file nor one of torch.save "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(state, Mapping):
        raise ShapeError(f"load_weights: {path} holds a {type(state).__name__}, not a dict of tensors by name")
    yield _checked_dict(state, path)


def _target(model: object) -> ModelSpec:
    if isinstance(model, Model):
        return model.spec
    if getattr(model, "is_remote", False) and hasattr(model, "load_state_dict"):
        spec = getattr(model, "spec", None)
        if isinstance(spec, ModelSpec):
            return spec
    if type(model).__name__ == "RemoteSubModel":
        raise TypeError(f"load_weights: {model!r} is a read-only view of a sub-model; load into the whole "
                        f"model, naming its params from the top (`{getattr(model, '_path', '')}...`)")
    raise TypeError(f"load_weights: expected a model (prog.Gpt.init(seed=0)), got {type(model).__name__}")


def load_weights(model: Any, source: Source, names: Mapping[str, str] | None = None, *,
                 transpose: Iterable[str] = (), keep: Iterable[str] = (), ignore: Iterable[str] = (),
                 cast: bool = False, strict: bool = True) -> WeightsReport:
    """Load `model`'s params and buffers from `source`, in another project's names and layout.

    `names` maps the model's dotted names (as `model.state_dict()` names them) to the source's, each
    side a pattern whose fields (`{i}`) stand for one part of a name:
    `{"h.{i}.attn.c_attn": "transformer.h.{i}.attn.c_attn.weight"}`; None: the same names.
    `transpose`: model names (or patterns) whose source matrix is stored transposed. `keep`: model
    names left as they are. `ignore`: source names that may go unread. `cast`: convert a source of
    another float dtype to the model's. `strict=False`: source tensors that nothing reads are no error.

    Every check is made before anything changes: a ShapeError lists each problem (a model name with
    no source, a missing source name, a wrong shape or dtype naming both names and both types, the
    source names nothing reads). Returns a WeightsReport."""
    spec = _target(model)
    pairs = _name_map(names)
    transposed_patterns, kept_patterns = _patterns(transpose, "transpose"), _patterns(keep, "keep")
    ignored_patterns = _patterns(ignore, "ignore")
    if not isinstance(cast, bool) or not isinstance(strict, bool):
        raise TypeError("load_weights: cast= and strict= are True or False")
    with _opened(source) as tensors, between_steps():
        state, problems, report = _gather(spec, tensors, pairs, transposed_patterns, kept_patterns,
                                          ignored_patterns, cast, strict)
        if len(problems) == 1:
            raise ShapeError(f"load_weights from {tensors.label}: {problems[0]}")
        if problems:
            lines = "\n".join("  " + p for p in problems)
            raise ShapeError(f"load_weights from {tensors.label}: {len(problems)} problems loading {spec.name} "
                             f"(declared at {spec.where}):\n{lines}")
        if report.kept:  # the model's own values, so that it takes a whole state at once
            own = model.state_dict()
            state.update({name: own[name] for name in report.kept})
        model.load_state_dict({name: state[name] for name, _ in leaves(spec)})
    return report


def _gather(spec: ModelSpec, tensors: _Tensors, pairs: list[tuple[_Pattern, _Pattern]] | None,
            transpose: list[_Pattern], keep: list[_Pattern], ignore: list[_Pattern], cast: bool,
            strict: bool) -> tuple[dict[str, torch.Tensor], list[str], WeightsReport]:
    """The state to load, by model name, each value checked against its declaration; the problems."""
    state: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    loaded: dict[str, str] = {}
    transposed, casted, kept, unmapped = [], [], [], []
    used_pairs: set[int] = set()
    used_transpose: set[int] = set()
    used_keep: set[int] = set()
    every = list(leaves(spec))
    for name, leaf in every:
        want = type_text(leaf.shape, leaf.dtype)
        keeps = [k for k, p in enumerate(keep) if p.match(name) is not None]
        if keeps:
            used_keep.update(keeps)
            kept.append(name)
            continue
        if pairs is None:
            source_name = name
        else:
            hits = [(k, theirs, fields) for k, (ours, theirs) in enumerate(pairs)
                    if (fields := ours.match(name)) is not None]
            used_pairs.update(k for k, _, _ in hits)
            if not hits:
                unmapped.append(name)
                problems.append(f"`{name}` ({want}, declared at {leaf.where}) is in no entry of names=, nor in "
                                f"keep= to leave it as it is")
                continue
            if len(hits) > 1:
                keys = " and ".join(f"`{pairs[k][0].text}`" for k, _, _ in hits)
                problems.append(f"`{name}` matches two entries of names=: {keys}")
                continue
            _, theirs, fields = hits[0]
            source_name = theirs.fill(fields)
        flips = [k for k, p in enumerate(transpose) if p.match(name) is not None]
        used_transpose.update(flips)
        if source_name not in tensors:
            hint = similar(source_name, tensors.names)
            problems.append(f"`{name}` reads `{source_name}`, which {tensors.label} lacks"
                            + (f": {hint}" if hint else ""))
            continue
        loaded[name] = source_name
        value = tensors[source_name]
        got = type_text(value.shape, value.dtype)
        if flips and value.dim() != 2:
            problems.append(f"`{name}` is in transpose=, but `{source_name}` is {got}: only a matrix transposes")
            continue
        stored = value
        if flips:
            value = value.T
            transposed.append(name)
        if tuple(value.shape) != leaf.shape:
            turned = f", transposed {shape_text(value.shape)}" if flips else ""
            if flips and tuple(stored.shape) == leaf.shape:
                hint = "; as it is stored it fits: leave it out of transpose="
            elif not flips and value.dim() == 2 and tuple(value.shape)[::-1] == leaf.shape:
                hint = "; transposed it would fit: name it in transpose="
            else:
                hint = ""
            problems.append(f"`{name}` is {want} (declared at {leaf.where}), but `{source_name}` is {got}"
                            f"{turned}{hint}")
            continue
        if value.dtype != leaf.dtype:
            floats = value.dtype.is_floating_point and leaf.dtype.is_floating_point
            if not (cast and floats):
                problems.append(f"`{name}` is {want} (declared at {leaf.where}), but `{source_name}` is {got}"
                                + ("; cast=True converts it" if floats else ""))
                continue
            value = value.to(leaf.dtype)
            casted.append(name)
        state[name] = value
    def unmatched(what: str, p: _Pattern, among: list[str]) -> str:
        if what != "keep" and any(p.match(name) is not None for name in kept):
            return f"{what}= entry `{p.text}` matches only what keep= leaves as it is"
        return f"{what}= entry `{p.text}` matches no param or buffer of {spec.name}" + p.nearest(among)

    if pairs is not None:  # the nearest of the names no entry matched
        problems.extend(unmatched("names", ours, unmapped) for k, (ours, _) in enumerate(pairs) if k not in used_pairs)
    matrices = [name for name, leaf in every if name not in kept and len(leaf.shape) == 2 and name not in transposed]
    problems.extend(unmatched("transpose", p, matrices) for k, p in enumerate(transpose) if k not in used_transpose)
    problems.extend(unmatched("keep", p, [name for name, _ in every]) for k, p in enumerate(keep) if k not in used_keep)
    read = set(loaded.values())
    unread = sorted(n for n in tensors.names if n not in read)
    extra = [n for n in unread if not any(p.match(n) is not None for p in ignore)]
    if strict and extra:
        problems.append(f"{len(extra)} tensor{'s' if len(extra) > 1 else ''} of {tensors.label} "
                        f"{'are' if len(extra) > 1 else 'is'} read by no param: "
                        + ", ".join(f"`{n}`" for n in extra)
                        + " (map them in names=, or let them go unread with ignore= or strict=False)")
    report = WeightsReport(tensors.label, spec.name, loaded, tuple(transposed), tuple(casted), tuple(kept),
                           tuple(unread))
    return state, problems, report
