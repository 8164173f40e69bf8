"""Checkpoints: a model (and optionally its optimizer) in one safetensors file, no pickle.

Tensors are `model.<dotted>` for params and buffers and `opt.<dotted>.<state key>` for the
optimizer's per-param state; the header's metadata holds a JSON document under "shapescript"
with the format, the model's type name, the optimizer's kind, its hyperparameters and torch's
param group. `load` checks everything before it changes anything.
"""

from __future__ import annotations

import errno
import json
import os
import uuid
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from shapescript.errors import ShapeError
from shapescript.runtime.model import Model, check_state, copy_state, leaves, type_text
from shapescript.runtime.optim import Optimizer

FORMAT = 1
_META = "shapescript"
# The per-param state each optimizer keeps: required keys, and keys it may add.
_STATE_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "AdamW": (frozenset({"step", "exp_avg", "exp_avg_sq"}), frozenset({"max_exp_avg_sq"})),
    "Sgd": (frozenset({"momentum_buffer"}), frozenset()),
}


def _json_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # torch allows a tensor lr
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint header")


def _check_pair(model: Model, opt: Optimizer | None, op: str) -> None:
    if not isinstance(model, Model):
        raise TypeError(f"{op}: expected a model, got {type(model).__name__}")
    if opt is not None and opt.model is not model:
        raise ShapeError(f"{op}: the {opt.kind} optimizer belongs to another "
                         f"{opt.model.spec.name} model, not this one")


def _remote(op: str, path: Any, model: Any, opt: Any) -> bool:
    """A model on several devices saves and loads through its workers, in the same file format."""
    if not getattr(model, "is_remote", False):
        return False
    model.workers().call(op, (os.fspath(path), model.handle, opt.handle if opt is not None else None),
                                  where=f"{op} {os.fspath(path)}")
    return True


def save(path: str | os.PathLike[str], model: Model, opt: Optimizer | None = None) -> None:
    """Write `model` (and `opt`'s state) to `path`, atomically."""
    if _remote("save", path, model, opt):
        return
    path = os.fspath(path)
    _check_pair(model, opt, "save")
    tensors = {f"model.{k}": v.cpu().contiguous() for k, v in model.state_dict().items()}
    meta: dict[str, Any] = {"format": FORMAT, "model": model.spec.name, "optimizer": None,
                            "hyper": None}
    if opt is not None:
        names = [name for name, _ in model.named_params()]
        state = opt.torch_opt.state_dict()
        scalars = []  # state values torch keeps as Python numbers, stored as 0-d f64 tensors
        for index, per_param in state["state"].items():
            for key, value in per_param.items():
                name = f"opt.{names[index]}.{key}"
                if isinstance(value, torch.Tensor):
                    tensors[name] = value.detach().cpu().clone().contiguous()
                elif value is not None:
                    tensors[name] = torch.tensor(float(value), dtype=torch.float64)
                    scalars.append(name)
        group = {k: v for k, v in state["param_groups"][0].items() if k != "params"}
        meta.update(optimizer=opt.kind, hyper=opt.hyper, group=group, scalars=scalars)
    header = {_META: json.dumps(meta, default=_json_value)}
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"save: no folder {folder} for the checkpoint", path)
    # A temp file beside the target and os.replace: a failed save never leaves half a file.
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        save_file(tensors, tmp, metadata=header)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _read(path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    if not os.path.isfile(path):
        raise FileNotFoundError(errno.ENOENT, f"no checkpoint at {path}", path)
    try:
        with safe_open(path, framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except SafetensorError as e:
        raise ShapeError(f"{path} is not a ShapeScript checkpoint: it is not a readable "
                         f"safetensors file ({e})") from None
    try:
        meta = json.loads(header[_META])
        ok = isinstance(meta, dict) and isinstance(meta.get("model"), str)
    except (KeyError, ValueError):
        ok = False
    if not ok:
        raise ShapeError(f"{path} is a safetensors file but not a ShapeScript checkpoint "
                         f"(its header has no valid '{_META}' entry)")
    if meta.get("format") != FORMAT:
        raise ShapeError(f"{path} is a ShapeScript checkpoint of format {meta.get('format')!r}; "
                         f"this version reads format {FORMAT}")
    return meta, tensors


def _opt_state(path: str, model: Model, opt: Optimizer, meta: dict[str, Any],
               tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The torch state_dict of `opt` held in the checkpoint, checked against the model."""
    if meta.get("optimizer") is None:
        raise ShapeError(f"checkpoint {path} holds no optimizer state to load into the "
                         f"{opt.kind} optimizer")
    if meta["optimizer"] != opt.kind:
        raise ShapeError(f"checkpoint {path} holds the state of an optimizer of kind "
                         f"{meta['optimizer']}, not {opt.kind}")
    names = [name for name, _ in model.named_params()]
    where = {name: leaf.where for name, leaf in leaves(model.spec)}
    params = dict(zip(names, model.params()))
    scalars = set(meta.get("scalars", ()))
    per_param: dict[str, dict[str, Any]] = {}
    problems = []
    for key, t in tensors.items():
        if not key.startswith("opt."):
            continue
        name, _, state_key = key[4:].rpartition(".")
        if name not in params:
            problems.append(f"`{key}` is the state of `{name}`, which is no param of "
                            f"{model.spec.name}")
            continue
        p = params[name]
        want = (() if state_key == "step" else tuple(p.shape),
                t.dtype if state_key == "step" else p.dtype)
        if (tuple(t.shape), t.dtype) != want:
            problems.append(f"`{key}` is {type_text(t.shape, t.dtype)}, expected "
                            f"{type_text(*want)} (declared at {where[name]})")
        per_param.setdefault(name, {})[state_key] = t.item() if key in scalars else t
    required, optional = _STATE_KEYS[opt.kind]
    for name, state in per_param.items():
        keys = set(state)
        if not required <= keys <= required | optional:
            problems.append(f"the {opt.kind} state of `{name}` has {sorted(keys)}, expected "
                            f"{sorted(required)} (declared at {where[name]})")
    if problems:
        lines = "\n".join("  " + p for p in problems)
        raise ShapeError(f"checkpoint {path}: the optimizer state does not fit "
                         f"{model.spec.name} (declared at {model.spec.where}):\n{lines}")
    index = {name: i for i, name in enumerate(names)}
    group = {k: v for k, v in opt.torch_opt.state_dict()["param_groups"][0].items()}
    group.update(meta.get("group") or {})
    if "betas" in group:
        group["betas"] = tuple(group["betas"])  # JSON made the tuple a list
    return {"state": {index[n]: s for n, s in per_param.items()}, "param_groups": [group]}


def load(path: str | os.PathLike[str], model: Model, opt: Optimizer | None = None) -> None:
    """Restore `model` (and `opt`) from `path`; on any mismatch nothing is changed."""
    if _remote("restore", path, model, opt):
        return
    path = os.fspath(path)
    _check_pair(model, opt, "load")
    meta, tensors = _read(path)
    spec = model.spec
    if meta["model"] != spec.name:
        raise ShapeError(f"checkpoint {path} holds a model of type {meta['model']}, not "
                         f"{spec.name} (declared at {spec.where})")
    foreign = [k for k in tensors if not k.startswith(("model.", "opt."))]
    if foreign:
        raise ShapeError(f"checkpoint {path} holds tensors ShapeScript does not write: "
                         f"{', '.join(sorted(foreign)[:5])}")
    state = {k[len("model."):]: t for k, t in tensors.items() if k.startswith("model.")}
    check_state(spec, state, f"checkpoint {path}")
    opt_state = _opt_state(path, model, opt, meta, tensors) if opt is not None else None
    copy_state(model, state)
    if opt is not None:
        opt.torch_opt.load_state_dict(opt_state)
        hyper = dict(meta.get("hyper") or {})
        if "betas" in hyper:
            hyper["betas"] = tuple(hyper["betas"])
        opt.hyper.update(hyper)
