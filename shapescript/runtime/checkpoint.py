"""Checkpoints: a model (and optionally its optimizer) in one safetensors file, no pickle.

Tensors are `model.<dotted>` for params and buffers and `opt.<dotted>.<state key>` for the
optimizer's per-param state; the header's metadata holds a JSON document under "shapescript"
with the format, the model's type name, the optimizer's kind, its hyperparameters and torch's
param group, and (where one drives the optimizer's lr) a torch scheduler's state as JSON under
"scheduler" (runtime/lr_schedulers.py). `load` checks everything before it changes anything, the
header's settings as ss.adamw / ss.sgd check their arguments, a scheduler's state against the form of
the scheduler it is loaded into.

`save` is atomic and leaves nothing behind: the target is always either its old file or the whole
new one, even if the process is killed midway (see `_write_file`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import torch
from safetensors import SafetensorError, safe_open

from shapescript.errors import DomainError, ShapeError
from shapescript.runtime.leftovers import TEMP_NAME, sweep, temp_beside, temp_name
from shapescript.runtime.model import Model, check_state, copy_state, leaves, param_names, type_text
from shapescript.runtime.optim import (
    EXTRA_RULES,
    KINDS,
    Optimizer,
    checked_hyper,
    grouped_names,
    named_state,
    param_hint,
    torch_optimizer,
)
from shapescript.runtime.schedules import Schedule
from shapescript.runtime.sinks import send_held
from shapescript.runtime.steps import between_steps

if TYPE_CHECKING:
    from typing_extensions import Buffer

FORMAT = 1
_META = "shapescript"
# safetensors' names of the dtypes a model may hold.
_DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                torch.uint8: "U8", torch.bool: "BOOL"}


def _json_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # torch allows a tensor lr
        return value.item()
    if isinstance(value, Schedule):  # read back by schedules.from_header
        return value.header()
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint header")


def _json_text(value: Any) -> str:
    """A header's value as JSON for a message: at most 200 characters, and a value nested nearly as deep
    as json.loads allows is named, not printed (printing it would overflow the stack)."""
    try:
        text = json.dumps(value)
    except (RecursionError, ValueError):
        return "a value nested too deep to show"
    return text if len(text) <= 200 else text[:200] + "..."


def _check_pair(model: Model, opt: Optimizer | None, op: str) -> None:
    if not isinstance(model, Model):
        raise TypeError(f"{op}: expected a model, got {type(model).__name__}")
    if opt is not None and opt.model is not model:
        raise ShapeError(f"{op}: the {opt.kind} optimizer belongs to another "
                         f"{opt.model.spec.name} model, not this one")


def _check_path(path: Any, op: str) -> None:
    """A checkpoint's path names a file: refuse anything else before the workers or a temp file see it."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{op}: a checkpoint's path is a str or os.PathLike, not {type(path).__name__}")
    if os.path.isdir(path):
        # !s: a bytes path shows as b'...'
        raise IsADirectoryError(errno.EISDIR, f"{op}: {os.fspath(path)!s} is a folder, not a checkpoint file",
                                os.fspath(path))


def _remote(op: str, path: Any, model: Any, opt: Any, scheduler: dict[str, Any] | None
            ) -> tuple[bool, dict[str, Any] | None]:
    """A model on several devices saves and loads through its workers, in the same file format. The
    scheduler driving the optimizer lives in the controller: a save sends its entry (worker 0 writes
    it), a restore its form, which every worker checks the file's against before changing anything,
    and gets the file's back."""
    if not getattr(model, "is_remote", False):
        return False, None
    replies = model._workers().call(op, (os.fspath(path), model._handle, opt._handle if opt is not None else None,
                                         scheduler), where=f"{op} {os.fspath(path)}")
    if op == "restore" and opt is not None:
        hyper, steps, entry = replies[0]
        opt.replace_settings(hyper, steps)  # the settings the checkpoint held, as one device's restore keeps them
        return True, entry
    return True, None


def _driving(opt: Any) -> Any:
    """The torch scheduler (runtime/lr_schedulers.py) that drives `opt`'s lr, or None."""
    return getattr(opt, "lr_scheduler", None) if opt is not None else None


def save(path: str | os.PathLike[str], model: Model, opt: Optimizer | None = None) -> None:
    """Write `model` (and `opt`'s state, and that of the scheduler driving its lr) to `path`,
    atomically; between two steps of a background run (runtime/steps.py), so that the params and the
    optimizer's state are those of one step."""
    _check_path(path, "save")
    with between_steps():
        driving = _driving(opt)
        scheduler = driving.entry() if driving is not None else None
        if not _remote("save", path, model, opt, scheduler)[0]:
            _save_here(os.fspath(path), model, opt, scheduler)


def save_for(path: str, model: Model, opt: Optimizer | None, scheduler: dict[str, Any] | None) -> None:
    """A worker's save (parallel/program_handlers.py): `scheduler` is the entry of the scheduler that
    drives the controller's optimizer, which the worker's knows nothing of."""
    _check_path(path, "save")
    with between_steps():
        _save_here(path, model, opt, scheduler)


def _save_here(path: str, model: Model, opt: Optimizer | None, scheduler: dict[str, Any] | None = None) -> None:
    _check_pair(model, opt, "save")
    tensors = {f"model.{k}": v.cpu().contiguous() for k, v in model.state_dict().items()}
    meta: dict[str, Any] = {"format": FORMAT, "model": model.spec.name, "optimizer": None,
                            "hyper": None}
    if opt is not None:
        state_tensors, state_scalars = named_state(opt)
        tensors.update({f"opt.{name}": t for name, t in state_tensors.items()})
        scalars = [f"opt.{name}" for name in state_scalars]  # stored as 0-d f64 tensors
        state = opt.torch_opt.state_dict()
        group = {k: v for k, v in state["param_groups"][0].items() if k != "params"}
        meta.update(optimizer=opt.kind, hyper=dict(opt.hyper), group=group, scalars=scalars, steps=opt.steps)
        if scheduler is not None:  # plain JSON already (LrScheduler.entry): nothing pickled
            meta["scheduler"] = scheduler
    header = {_META: json.dumps(meta, default=_json_value)}
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"save: no folder {folder} for the checkpoint", path)
    _write_file(path, folder, tensors, header)


def _write_file(path: str, folder: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write the checkpoint so that `path` is always its old file or the whole new one, and a save
    killed midway leaves nothing for long: the data goes to an unnamed file in `folder` (Linux's
    O_TMPFILE, which vanishes with the process), is fsync'd, gets a temporary name that os.replace
    moves onto `path` at once, and the folder is fsync'd so that the rename lasts. A kill between
    the naming and the rename, or any kill where there is no O_TMPFILE (the file has its temporary
    name from the start), leaves a file named for its process, which the next save into the folder
    removes (runtime/leftovers.py's `temp_beside` and `sweep`)."""
    tmp = ""  # no name yet
    folder_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fd = _unnamed_file(folder)
        if fd is None:
            fd, tmp = temp_beside(path)
        else:
            sweep(folder, TEMP_NAME, folders=False)  # what saves killed where O_TMPFILE failed left
        with open(fd, "wb") as f:
            _write_safetensors(f, tensors, metadata)
            f.flush()
            os.fsync(f.fileno())
            if not tmp:  # now a name, for an atomic os.replace. With a folder fd, os.link is linkat
                # (AT_SYMLINK_FOLLOW), which links the file /proc's link points to, not the link; it
                # never writes through a name that exists.
                name = temp_name(path)
                os.link(f"/proc/self/fd/{f.fileno()}", name, dst_dir_fd=folder_fd)
                tmp = os.path.join(folder, name)
        os.replace(tmp, path)
        _fsync_folder(folder_fd)
    except BaseException:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        os.close(folder_fd)


def _unnamed_file(folder: str) -> int | None:
    """A file in `folder` with no name, open for writing; None where there is no O_TMPFILE (or no
    /proc/self/fd to name it by) or the filesystem refuses one."""
    if not hasattr(os, "O_TMPFILE") or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(folder, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o666)
    except OSError:
        return None


def _fsync_folder(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):  # a filesystem that can't sync a folder
            raise


def _write_safetensors(f: BinaryIO, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """`tensors` in the safetensors layout (the header's size in 8 bytes, the JSON header, the data),
    written straight from their memory. safetensors' save_file can't write into an open file, and
    (in recent versions) writes through a named temporary file of its own, which a kill leaves."""
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))  # as safetensors: aligned
    entries: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in order:
        t = tensors[name]
        if t.dtype not in _DTYPE_NAMES:
            raise TypeError(f"save: `{name}` is a {t.dtype} tensor, which a checkpoint can't hold")
        size = t.numel() * t.element_size()
        entries[name] = {"dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                         "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(entries, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    f.write(len(head).to_bytes(8, "little") + head)
    for name in order:
        # an ndarray is a Buffer; numpy's stubs say so only for Python 3.12 on (`__buffer__`)
        f.write(cast("Buffer", tensors[name].detach().reshape(-1).view(torch.uint8).numpy()))


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
    except (KeyError, ValueError, RecursionError):  # RecursionError: JSON nested deeper than Python's stack
        ok = False
    if not ok:
        raise ShapeError(f"{path} is a safetensors file but not a ShapeScript checkpoint "
                         f"(its header has no valid '{_META}' entry)")
    if meta.get("format") != FORMAT:
        raise ShapeError(f"{path} is a ShapeScript checkpoint of format {_json_text(meta.get('format'))}; "
                         f"this version reads format {FORMAT}")
    return meta, tensors


def _settings(path: str, opt: Optimizer, meta: dict[str, Any], count: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The optimizer's settings in the header, checked as ss.adamw and ss.sgd check their arguments:
    `hyper` (every one of its kind's) and the torch param group's (of its `count` params), whose
    flags stay the optimizer's own. Returns (hyper, the param group to load)."""
    at = f"checkpoint {path}: its header's"
    hyper, group = meta.get("hyper"), meta.get("group")
    for key, value in (("hyper", hyper), ("group", group)):
        if not isinstance(value, dict):
            raise ShapeError(f"{at} `{key}` is {_json_text(value)}, not the {opt.kind} optimizer's settings")
    assert isinstance(hyper, dict) and isinstance(group, dict)
    rules = KINDS[opt.kind].settings
    hyper = {"no_decay": [], **hyper}  # written before param groups: every param decays
    missing, extra = sorted(set(rules) - set(hyper)), sorted(set(hyper) - set(rules))
    if missing or extra:
        raise ShapeError(f"{at} `hyper` " + (f"lacks {', '.join(missing)}" if missing else
                                             f"has {', '.join(extra)}, which {opt.kind} doesn't take"))
    if group.get("params", list(range(count))) != list(range(count)):
        raise ShapeError(f"{at} `group.params` is {_json_text(group['params'])}; the optimizer's "
                         f"params are numbered 0 to {count - 1}")
    hyper = checked_hyper(opt.kind, hyper, f"{at} hyper.")
    trained = param_names(opt.model.spec)
    unknown = [n for n in hyper["no_decay"] if n not in trained]
    if unknown:
        raise ShapeError(f"{at} `hyper.no_decay` names {unknown[0]!r}, which is no trained param of "
                         f"{opt.model.spec.name} (declared at {opt.model.spec.where}): "
                         f"{param_hint(str(unknown[0]), list(trained))}")
    # torch's flags stay the optimizer's own; its settings are the checkpoint's, group by group
    # (the params without weight decay keep none).
    groups = torch_optimizer(opt.kind, opt.model, hyper).state_dict()["param_groups"]
    ours = checked_hyper(opt.kind, {k: v for k, v in group.items()
                                    if k in groups[0] and (k in rules or k in EXTRA_RULES)}, f"{at} group.")
    for g in groups:
        g.update({k: v for k, v in ours.items() if not (k == "weight_decay" and g["weight_decay"] == 0.0)})
    return hyper, groups


# State that is a sum or a mean of squares (Adam's, RMSprop's, Adagrad's, Adadelta's): never below 0.
_SQUARES = frozenset({"exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum", "acc_delta"})


def _steps(path: str, meta: dict[str, Any]) -> int:
    """The updates the optimizer had made (its schedule's position); 0 in a checkpoint written before
    they were counted."""
    steps = meta.get("steps", 0)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise DomainError(f"checkpoint {path}: its header's `steps` must be a whole number >= 0 (the updates "
                          f"made), not {_json_text(steps)}")
    return steps


def _check_state_values(path: str, per_param: dict[str, dict[str, Any]]) -> None:
    """Values of the optimizer's state that no training makes, which would turn into NaNs."""
    for name, state in per_param.items():
        for key, value in state.items():
            if key == "step":
                step = float(value)
                if not (0 <= step < math.inf and step == int(step)):
                    raise DomainError(f"checkpoint {path}: `opt.{name}.step` must be a whole number >= 0 "
                                      f"(steps taken), not {step:g}")
            elif key in _SQUARES and not bool((torch.as_tensor(value) >= 0).all()):
                raise DomainError(f"checkpoint {path}: `opt.{name}.{key}` must be >= 0 everywhere "
                                  f"(a mean of squares), but holds {torch.as_tensor(value).min().item():g}")


def _opt_state(path: str, model: Model, opt: Optimizer, meta: dict[str, Any],
               tensors: dict[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The torch state_dict of `opt` held in the checkpoint, checked against the model, and the
    optimizer's hyperparameters."""
    if meta.get("optimizer") is None:
        raise ShapeError(f"checkpoint {path} holds no optimizer state to load into the "
                         f"{opt.kind} optimizer")
    if meta["optimizer"] != opt.kind:
        kind = meta["optimizer"] if isinstance(meta["optimizer"], str) else _json_text(meta["optimizer"])
        raise ShapeError(f"checkpoint {path} holds the state of an optimizer of kind {kind}, not {opt.kind}")
    names = [name for name, _ in model.named_params()]
    where = {name: leaf.where for name, leaf in leaves(model.spec)}
    params = dict(zip(names, model.params()))
    hyper, groups = _settings(path, opt, meta, len(names))
    scalars = meta.get("scalars", [])
    if not (isinstance(scalars, list) and all(isinstance(k, str) for k in scalars)):
        raise ShapeError(f"checkpoint {path}: its header's `scalars` is {_json_text(scalars)}, not a list of "
                         f"tensor names")
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
        per_param.setdefault(name, {})[state_key] = t.item() if key in scalars and t.numel() == 1 else t
    rules = KINDS[opt.kind]
    by_setting = set(rules.by_setting.values())
    required = rules.state | {key for name, key in rules.by_setting.items() if hyper[name]}
    optional = rules.optional_state | by_setting  # a setting turned off (opt.set) leaves its state
    for name, state in per_param.items():
        keys = set(state)
        if not required <= keys <= required | optional:
            problems.append(f"the {opt.kind} state of `{name}` has {sorted(keys)}, expected "
                            f"{sorted(required)} (declared at {where[name]})")
    if problems:
        lines = "\n".join("  " + p for p in problems)
        raise ShapeError(f"checkpoint {path}: the optimizer state does not fit "
                         f"{model.spec.name} (declared at {model.spec.where}):\n{lines}")
    _check_state_values(path, per_param)
    index = {name: i for i, name in enumerate(grouped_names(model.spec, hyper["no_decay"]))}
    return {"state": {index[n]: s for n, s in per_param.items()}, "param_groups": groups}, hyper


def load(path: str | os.PathLike[str], model: Model, opt: Optimizer | None = None) -> None:
    """Restore `model` (and `opt`, and the scheduler driving its lr) from `path`; on any mismatch
    nothing is changed. Between two steps of a background run, as `save`."""
    send_held()  # the records a GPU's values held back, before the model changes (runtime/sinks.py)
    _check_path(path, "restore")
    with between_steps():
        driving = _driving(opt)
        form = driving.entry() if driving is not None else None
        done, entry = _remote("restore", path, model, opt, form)
        if not done:
            entry = _load_here(os.fspath(path), model, opt, form)
        if driving is not None and entry is not None:
            driving.load_entry(entry)  # checked against its form: it can't fail now


def load_for(path: str, model: Model, opt: Optimizer | None, form: dict[str, Any] | None) -> dict[str, Any] | None:
    """A worker's restore (parallel/program_handlers.py): `form` is the entry of the scheduler that
    drives the controller's optimizer; the file's, checked against it, is returned for the controller."""
    _check_path(path, "restore")
    with between_steps():
        return _load_here(path, model, opt, form)


def _load_here(path: str, model: Model, opt: Optimizer | None, form: dict[str, Any] | None = None
               ) -> dict[str, Any] | None:
    """Load; the header's scheduler entry, checked against `form`, where one drives `opt`."""
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
    fresh = None
    steps = 0
    if opt is not None:  # a torch optimizer with the checkpoint's groups, swapped in with the model
        torch_state, hyper = _opt_state(path, model, opt, meta, tensors)
        steps = _steps(path, meta)
        fresh = torch_optimizer(opt.kind, model, hyper, steps)
        fresh.load_state_dict(torch_state)
    entry = _scheduler_in(path, meta, form) if opt is not None and form is not None else None
    copy_state(model, state)
    if opt is not None and fresh is not None:
        opt.torch_opt = fresh
        opt.replace_settings(hyper, steps)
    return entry


def _scheduler_in(path: str, meta: dict[str, Any], form: dict[str, Any]) -> dict[str, Any]:
    """The header's `scheduler` entry, checked against `form`: the entry of the scheduler it is
    loaded into (LrScheduler.entry: its class's name, its state and its param group as JSON)."""
    saved, name = meta.get("scheduler"), form["class"]
    if saved is None:
        raise ShapeError(f"checkpoint {path} holds no lr scheduler's state for the {name} that drives the "
                         f"optimizer: restore it before making the scheduler (which then starts from the lr restored)")
    if not isinstance(saved, dict) or set(saved) != set(form):
        raise ShapeError(f"checkpoint {path}: its header's `scheduler` is {_json_text(saved)}, not a scheduler's "
                         f"{', '.join(sorted(form))}")
    if saved["class"] != name:
        held = saved["class"] if isinstance(saved["class"], str) else _json_text(saved["class"])
        raise ShapeError(f"checkpoint {path} holds the state of a {held} scheduler, not of the {name} that drives "
                         f"the optimizer")
    for key in ("state", "group"):
        checked_scheduler_form(saved[key], form[key], f"checkpoint {path}: its header's `scheduler.{key}", name)
    return saved


def checked_scheduler_form(saved: Any, form: Any, where: str, name: str) -> None:
    """`saved` (JSON read back) has `form`'s (the JSON of the state of the scheduler, class `name`, it
    is loaded into): the same keys, lists as long, the same strings and Nones (a scheduler's settings:
    OneCycleLR names param group keys with them), bools for bools, whole numbers within int64 for whole
    numbers, numbers (not NaN) for floats. Else ShapeError (DomainError for a number out of range).
    `where` is the message's start, "...`scheduler.state"; the path inside is added to it, then "`"."""
    if isinstance(form, dict):
        if not isinstance(saved, dict) or set(saved) != set(form):
            keys = f"has the keys {_json_text(sorted(saved))}" if isinstance(saved, dict) else f"is {_json_text(saved)}"
            raise ShapeError(f"{where}` {keys}, where the {name}'s has {_json_text(sorted(form))}: a scheduler "
                             f"made with other settings")
        for key, value in form.items():
            checked_scheduler_form(saved[key], value, f"{where}.{key}", name)
    elif isinstance(form, list):
        if not isinstance(saved, list) or len(saved) != len(form):
            raise ShapeError(f"{where}` is {_json_text(saved)}, where the {name}'s has {len(form)} entries: a "
                             f"scheduler made with other settings")
        for k, value in enumerate(form):
            checked_scheduler_form(saved[k], value, f"{where}[{k}]", name)
    elif form is None or isinstance(form, (bool, str)):
        if not (saved is None if form is None else type(saved) is type(form) and (isinstance(form, bool) or saved == form)):
            raise ShapeError(f"{where}` is {_json_text(saved)}, where the {name}'s is {_json_text(form)}: a "
                             f"scheduler made with other settings")
    else:  # a number
        whole = isinstance(form, int)
        if isinstance(saved, bool) or not isinstance(saved, int if whole else (int, float)):
            raise ShapeError(f"{where}` is {_json_text(saved)}, where the {name}'s is "
                             f"{'a whole number' if whole else 'a number'}")
        if saved != saved or (whole and not -2**63 <= saved < 2**63):  # NaN; an int no tensor holds
            raise DomainError(f"{where}` must be {'a whole number within int64' if whole else 'a number'}, "
                              f"not {_json_text(saved)}")
