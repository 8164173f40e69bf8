"""Gradients and optimizers: thin wrappers over torch.autograd and torch.optim.

The maths is torch's own (AdamW, Adam, SGD, RMSprop, Adagrad, Adadelta); this module only keeps a
model, its optimizer and its gradients aligned by the order of `Model.params()`, counts the updates
(the position of an lr schedule, runtime/schedules.py) and checks the settings.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Protocol, cast

import torch

from shapescript.errors import DomainError, ShapeError
from shapescript.names import similar
from shapescript.optimizers import OptimizerKind
from shapescript.runtime.fused_step import optimizer_step
from shapescript.runtime.grads import Grads
from shapescript.runtime.loss_scale import overflowed, scale_kept
from shapescript.runtime.model import Model, ModelSpec, leaves, param_names
from shapescript.runtime.schedules import Schedule, from_header
from shapescript.runtime.sigint import deliver_ctrl_c, hold_ctrl_c, release_ctrl_c
from shapescript.runtime.sinks import send_held
from shapescript.runtime.steps import between_steps


class Settings(Mapping[str, Any]):
    """An optimizer's settings, read-only: an assignment would be ignored by torch's param groups, so
    it is refused, and `opt.set(...)` changes them instead."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __setitem__(self, key: str, value: Any) -> None:
        raise TypeError(f"an optimizer's settings can't be assigned: opt.set({key}=...) changes them from "
                        f"the next update on and keeps the optimizer's state")

    def update(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("an optimizer's settings can't be assigned: opt.set(name=value, ...) changes them "
                        "from the next update on and keeps the optimizer's state")

    def __repr__(self) -> str:
        return repr(self._values)


class SettingsView:
    """What an optimizer on one device and one on several (parallel/remote.py's RemoteOptimizer)
    both show of their settings (`_settings`), and the torch scheduler that drives its lr, if one
    does (runtime/lr_schedulers.py's, held weakly: a scheduler no one holds drives nothing)."""

    __slots__ = ()
    _settings: Settings
    _lr_scheduler: Callable[[], Any] | None

    @property
    def lr_scheduler(self) -> Any:
        """The `ss.lr_scheduler` driving this optimizer's lr (a checkpoint holds its state), or None."""
        follow = self._lr_scheduler
        return follow() if follow is not None else None

    @property
    def hyper(self) -> Settings:
        return self._settings

    @property
    def schedule(self) -> Schedule | None:
        lr = self._settings["lr"]
        return lr if isinstance(lr, Schedule) else None


class Optimizer(SettingsView):
    """A torch optimizer bound to one model; `kind` is the .ss type's name.

    Its torch param groups: one with every trained param, or, when `hyper["no_decay"]` names
    some, the others first (with the optimizer's weight decay) and those second (with none), as
    nanoGPT and most transformer recipes group them. `steps` counts its updates: an lr schedule's
    position."""

    __slots__ = ("kind", "model", "torch_opt", "_settings", "steps", "_lr_scheduler")

    def __init__(self, kind: OptimizerKind, model: Model, torch_opt: torch.optim.Optimizer,
                 hyper: Mapping[str, Any], steps: int = 0) -> None:
        self.kind = kind
        self.model = model
        self.torch_opt = torch_opt
        self._settings = Settings(hyper)
        self.steps = steps
        self._lr_scheduler = None

    @property
    def lr(self) -> float:
        """The lr of the next update: its schedule's at this position, or the fixed one."""
        return lr_at(self._settings["lr"], self.steps)

    def set(self, **settings: Any) -> None:
        """Change settings (`lr=`, a number or a schedule, `weight_decay=`, ...) from the next update
        on, keeping the state (moments, step counts, the schedule's position). Between two steps of a
        background run."""
        with between_steps():
            changed = checked_change(self.kind, self._settings, settings)
            missing = [(name, key) for name, key in KINDS[self.kind].by_setting.items() if changed.get(name)
                       and any(key not in s for s in self.torch_opt.state.values())]
            if missing:  # torch makes that state at the first update only, and would fail without it
                name, key = missing[0]
                raise DomainError(f"{self.kind.maker}.set: {name} can't be turned on after the first update "
                                  f"(the state has no {key}); make the optimizer with {name}= set")
            apply_settings(self.torch_opt, self._settings, changed, self.steps)
            self._settings = Settings({**self._settings, **changed})

    def replace_settings(self, hyper: Mapping[str, Any], steps: int) -> None:
        """The settings and position a checkpoint held (its torch groups are loaded with its state)."""
        self._settings = Settings(hyper)
        self.steps = steps

    def param_order(self) -> list[str]:
        """The params' dotted names in torch's order: its state_dict numbers them this way."""
        return grouped_names(self.model.spec, self.hyper.get("no_decay", ()))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state by param and key (`w1.exp_avg`), as detached copies: what a checkpoint holds
        under `opt.`."""
        with between_steps():  # a background run's step changes it in place
            return named_state(self)[0]

    def __repr__(self) -> str:
        return f"{self.kind}[{self.model.spec.name}]({settings_text(self._settings)})"


def settings_text(hyper: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in hyper.items() if k != "no_decay" or v)


def lr_at(lr: float | Schedule, steps: int) -> float:
    return lr.at(steps) if isinstance(lr, Schedule) else lr


def checked_change(kind: OptimizerKind, hyper: Mapping[str, Any], change: Mapping[str, Any]) -> dict[str, Any]:
    """`opt.set(**change)`'s settings, checked as the optimizer's maker checks them."""
    where = f"{kind.maker}.set: "
    for name in change:
        if name == "no_decay":
            raise DomainError(f"{where}no_decay groups the params when the optimizer is made; make a new "
                              f"optimizer for other groups")
        if name not in KINDS[kind].settings:
            known = [n for n in KINDS[kind].settings if n != "no_decay"]
            hint = similar(name, known)
            raise DomainError(f"{where}{kind} has no setting {name!r}; it has {', '.join(known)}"
                              f"{'; ' + hint if hint else ''}")
    changed = checked_hyper(kind, change, where)
    if kind == OptimizerKind.SGD:
        checked_hyper(kind, {**hyper, **changed}, where)  # nesterov's conditions on the others
    return changed


def apply_settings(torch_opt: torch.optim.Optimizer, hyper: Mapping[str, Any], changed: Mapping[str, Any],
                   steps: int) -> None:
    """Set `changed` in every param group; the group of the params no_decay names (torch_groups puts
    it last) keeps no weight decay."""
    undecayed = torch_opt.param_groups[-1] if hyper.get("no_decay") else None
    for group in torch_opt.param_groups:
        for name, value in changed.items():
            if not (name == "weight_decay" and group is undecayed):
                group[name] = lr_at(value, steps) if name == "lr" else value


class _RemoteModel(Protocol):
    """What `_make` uses of parallel/remote.py's RemoteModel (the run time imports nothing of parallel/).
    Its optimizer is a RemoteOptimizer, which stands for an Optimizer as the model does for a Model."""

    def _make_optimizer(self, kind: str, hyper: dict[str, Any]) -> Any: ...


def named_state(opt: Optimizer) -> tuple[dict[str, torch.Tensor], list[str]]:
    """`opt`'s state by `param.key` as detached copies, and the names of the values torch keeps as
    Python numbers (made 0-d f64 tensors here)."""
    names = opt.param_order()  # torch numbers the params group by group
    tensors: dict[str, torch.Tensor] = {}
    scalars = []
    for index, per_param in opt.torch_opt.state_dict()["state"].items():
        for key, value in per_param.items():
            name = f"{names[index]}.{key}"
            if isinstance(value, torch.Tensor):
                tensors[name] = value.detach().cpu().clone().contiguous()
            elif value is not None:
                tensors[name] = torch.tensor(float(value), dtype=torch.float64)
                scalars.append(name)
    return tensors, scalars


def grouped_names(spec: ModelSpec, no_decay: Any) -> list[str]:
    """Every param's name, those with weight decay first, in declaration order within each."""
    names, skip = param_names(spec), set(no_decay)
    return [n for n in names if n not in skip] + [n for n in names if n in skip]


def no_decay_names(spec: ModelSpec, choice: Any, kind: str) -> list[str]:
    """`no_decay=` as the names of the params it picks, in declaration order. A function is asked
    `(name, param)` for each param, the param as a tensor on torch's meta device (its shape and
    dtype, no values), so that the choice is the same on any device count and is made once."""
    names = param_names(spec)
    if choice is None:
        return []
    if callable(choice):
        shapes = {name: leaf for name, leaf in leaves(spec) if leaf.kind == "param"}
        picked = set()
        for name in names:
            leaf = shapes[name]
            answer = choice(name, torch.empty(leaf.shape, dtype=leaf.dtype, device="meta"))
            if not isinstance(answer, (bool, torch.Tensor)) or (isinstance(answer, torch.Tensor) and answer.numel() != 1):
                raise DomainError(f"{kind.lower()}: no_decay({name!r}, p) must return True or False, "
                                  f"not {answer!r}")
            if bool(answer):
                picked.add(name)
        return [n for n in names if n in picked]
    if isinstance(choice, str) or not isinstance(choice, (list, tuple, set, frozenset)):
        raise DomainError(f"{kind.lower()}: no_decay must be a function (name, param) -> bool or a list of "
                          f"param names, not {type(choice).__name__}")
    for name in choice:
        if name not in names:
            raise DomainError(f"{kind.lower()}: no_decay names {name!r}, which is no trained param of "
                              f"{spec.name} (declared at {spec.where}); {param_hint(str(name), names)}")
    return [n for n in names if n in set(choice)]


def param_hint(name: str, names: Sequence[str], most: int = 6) -> str:
    """What follows a name that is no trained param: the one "did you mean" of every name lookup
    (names.similar) when a param's name is close, else the params' names (the first `most`)."""
    close = similar(name, names)
    if close:
        return close
    if not names:
        return "it has no trained params"
    shown = ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
    return f"its trained params are {shown}"


def torch_groups(m: Model, hyper: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The param groups torch gets for `hyper`: one, or the decayed params and the others."""
    named = dict(m.named_params())
    skip = set(hyper.get("no_decay", ()))
    decay = [named[n] for n in named if n not in skip]
    groups: list[dict[str, Any]] = [{"params": decay}] if decay else []
    if skip:
        groups.append({"params": [named[n] for n in named if n in skip], "weight_decay": 0.0})
    return groups


def _setting_text(value: Any) -> str:
    """`value!r` for a message, at most 200 characters; an int too long to print whole (Python refuses
    past 4300 digits) by its size."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"an int of {value.bit_length()} bits (about 10**{int(value.bit_length() * math.log10(2))})"
    try:
        text = repr(value)
    except RecursionError:  # a checkpoint's list nested nearly as deep as json.loads allows
        return "a value nested too deep to show"
    return text if len(text) <= 200 else text[:200] + "..."


def _rate(value: Any) -> float:
    # `not 0 <= value < math.inf` (NaN too) in the `<` that numbers.Real declares: 0 <= value needs its >=
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0 or not value < math.inf:
        raise ValueError("a finite number >= 0")
    try:
        return float(value)
    except OverflowError:  # an int past the largest float (10**400), finite as Python compares it
        raise ValueError("a finite number >= 0 that fits a float (at most about 1.8e308)") from None


def _betas(value: Any) -> tuple[float, float]:
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(b, numbers.Real) and not isinstance(b, bool) and not b < 0 and b < 1 for b in value)):
        raise ValueError("two numbers in [0, 1)")
    return float(value[0]), float(value[1])


def _names(value: Any) -> list[str]:
    if not (isinstance(value, (list, tuple)) and all(isinstance(n, str) for n in value)):
        raise ValueError("a list of param names")
    return list(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("True or False")
    return value


def _lr(value: Any) -> float | Schedule:
    """A number, or a schedule (ss.schedules; in a checkpoint's header, its `header()` form)."""
    if isinstance(value, Schedule):
        return value
    if isinstance(value, dict):
        try:
            return from_header(value, "lr")
        except DomainError as e:
            raise ValueError(f"a number or a schedule ({e})") from None
    return _rate(value)


def _fraction(value: Any) -> float:
    try:
        number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an int past the largest float
        number = math.nan
    if not 0.0 <= number <= 1.0:
        raise ValueError("a number in [0, 1]")
    return number


@dataclass(frozen=True)
class KindRules:
    """An optimizer kind as the run time makes it: torch's class; its settings as ss.<maker> takes
    them, each with what it may be (the checks the maker, `opt.set` and a checkpoint's header go
    through: torch checks fewer, and some too late); the per-param state it keeps: always (`state`),
    where a setting is on (`by_setting`: setting -> state key), and perhaps (`optional_state`); whether torch has a fused CPU kernel for it, and whether it takes
    `capturable` (its step count kept on the device, so that a recorded CUDA step can capture it)."""

    torch_class: Callable[..., torch.optim.Optimizer]
    settings: Mapping[str, Callable[[Any], Any]]
    state: frozenset[str]
    optional_state: frozenset[str] = frozenset()
    by_setting: Mapping[str, str] = field(default_factory=dict)
    fused: bool = False
    capturable: bool = False


_ADAM_SETTINGS = {"lr": _lr, "betas": _betas, "eps": _rate, "weight_decay": _rate, "no_decay": _names}
KINDS: dict[OptimizerKind, KindRules] = {
    OptimizerKind.ADAMW: KindRules(torch.optim.AdamW, _ADAM_SETTINGS, frozenset({"step", "exp_avg", "exp_avg_sq"}),
                                   frozenset({"max_exp_avg_sq"}), fused=True, capturable=True),
    OptimizerKind.ADAM: KindRules(torch.optim.Adam, _ADAM_SETTINGS, frozenset({"step", "exp_avg", "exp_avg_sq"}),
                                  frozenset({"max_exp_avg_sq"}), fused=True, capturable=True),
    OptimizerKind.SGD: KindRules(torch.optim.SGD, {"lr": _lr, "momentum": _rate, "weight_decay": _rate,
                                                   "nesterov": _flag, "no_decay": _names}, frozenset(),
                                 by_setting={"momentum": "momentum_buffer"}, fused=True),
    OptimizerKind.RMSPROP: KindRules(
        torch.optim.RMSprop, {"lr": _lr, "alpha": _fraction, "eps": _rate, "weight_decay": _rate, "momentum": _rate,
                              "centered": _flag, "no_decay": _names},
        frozenset({"step", "square_avg"}), by_setting={"momentum": "momentum_buffer", "centered": "grad_avg"},
        capturable=True),
    OptimizerKind.ADAGRAD: KindRules(
        torch.optim.Adagrad, {"lr": _lr, "lr_decay": _rate, "weight_decay": _rate, "initial_accumulator_value": _rate,
                              "eps": _rate, "no_decay": _names}, frozenset({"step", "sum"}), fused=True),
    OptimizerKind.ADADELTA: KindRules(
        torch.optim.Adadelta, {"lr": _lr, "rho": _fraction, "eps": _rate, "weight_decay": _rate, "no_decay": _names},
        frozenset({"step", "square_avg", "acc_delta"}), capturable=True),
}
EXTRA_RULES: dict[str, Callable[[Any], Any]] = {"dampening": _rate}  # torch's own, in a param group


def checked_hyper(kind: OptimizerKind, hyper: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`hyper` (some of `kind`'s settings in KINDS, or EXTRA_RULES), each checked and made a float,
    a pair of floats, a bool or a schedule. DomainError "{where}{name} must be ..., not {value!r}"."""
    rules = {**KINDS[kind].settings, **EXTRA_RULES}
    out = {}
    for name, value in hyper.items():
        try:
            out[name] = rules[name](value)
        except ValueError as e:
            raise DomainError(f"{where}{name} must be {e}, not {_setting_text(value)}") from None
    if out.get("nesterov") and not (out.get("momentum", 1.0) > 0 and out.get("dampening", 0.0) == 0):
        raise DomainError(f"{where}nesterov can be True only with a momentum > 0 and no dampening")
    return out


# Set by runtime/recorded.py, which records steps on cuda devices: whether an optimizer of params on
# this device is made capturable. Nothing records in a standalone build: none is.
def _never(device: torch.device) -> bool:
    return False


capturable_on: Callable[[torch.device], bool] = _never


def _make(kind: OptimizerKind, m: Model, hyper: dict[str, Any]) -> Optimizer:
    remote = getattr(m, "is_remote", False)
    if not remote and not isinstance(m, Model):
        raise TypeError(f"{kind.lower()}: expected a model, got {type(m).__name__}")
    hyper = checked_hyper(kind, {**hyper, "no_decay": no_decay_names(m.spec, hyper["no_decay"], kind)},
                          f"{kind.maker}: ")
    if remote:  # a model on several devices: the state is made on every worker
        return cast(_RemoteModel, m)._make_optimizer(kind, hyper)  # is_remote: a RemoteModel
    if not m.params():
        raise DomainError(f"{kind.lower()}: model {m.spec.name} (declared at {m.spec.where}) has "
                          f"no trained params")
    try:
        torch_opt = torch_optimizer(kind, m, hyper)
    except ValueError as e:  # torch checks the ranges ("Invalid learning rate: -1")
        raise DomainError(f"{kind.lower()}: {e}") from None
    return Optimizer(kind, m, torch_opt, hyper)


def torch_optimizer(kind: OptimizerKind, m: Model, hyper: Mapping[str, Any], steps: int = 0) -> torch.optim.Optimizer:
    """torch's optimizer of `kind` for `m`, with `hyper`'s settings (a schedule's lr at `steps`) and
    param groups."""
    rules = KINDS[kind]
    settings = {k: lr_at(v, steps) if k == "lr" else v for k, v in hyper.items() if k != "no_decay"}
    params = m.params()
    # Recorded steps capture the step, which needs the step count on the device; SGD keeps none.
    capturable = rules.capturable and bool(params) and capturable_on(params[0].device)
    if capturable:
        settings["capturable"] = True
    elif rules.fused and params and params[0].device.type == "cpu" and all(p.is_contiguous() for p in params):
        # torch's fused kernels on cpu: one pass over each param instead of a dozen tensor ops
        # (AdamW on the README's MLP 77 µs a step against 458; SGD's results are bitwise the same,
        # AdamW's within rounding). See docs/benchmarks.md.
        settings["fused"] = True
    made = rules.torch_class(torch_groups(m, hyper), **settings)
    if capturable:  # torch's warning that such a step is slower uncaptured: warm-ups are so by design
        made._warned_capturable_if_run_uncaptured = True
    return made


# The makers: torch's defaults, except AdamW's lr and SGD's (torch has none). `lr` is a number or a
# schedule (ss.schedules); `no_decay` names the params kept out of weight decay, or picks them.
Lr = float | Schedule


def adamw(m: Model, lr: Lr = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
          eps: float = 1e-8, weight_decay: float = 1e-2, no_decay: Any = None) -> Optimizer:
    hyper = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "no_decay": no_decay}
    return _make(OptimizerKind.ADAMW, m, hyper)


def adam(m: Model, lr: Lr = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
         eps: float = 1e-8, weight_decay: float = 0.0, no_decay: Any = None) -> Optimizer:
    hyper = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "no_decay": no_decay}
    return _make(OptimizerKind.ADAM, m, hyper)


def sgd(m: Model, lr: Lr = 1e-3, momentum: float = 0.0, weight_decay: float = 0.0,
        nesterov: bool = False, no_decay: Any = None) -> Optimizer:
    hyper = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "nesterov": nesterov,
             "no_decay": no_decay}
    return _make(OptimizerKind.SGD, m, hyper)


def rmsprop(m: Model, lr: Lr = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
            momentum: float = 0.0, centered: bool = False, no_decay: Any = None) -> Optimizer:
    hyper = {"lr": lr, "alpha": alpha, "eps": eps, "weight_decay": weight_decay, "momentum": momentum,
             "centered": centered, "no_decay": no_decay}
    return _make(OptimizerKind.RMSPROP, m, hyper)


def adagrad(m: Model, lr: Lr = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
            initial_accumulator_value: float = 0.0, eps: float = 1e-10, no_decay: Any = None) -> Optimizer:
    hyper = {"lr": lr, "lr_decay": lr_decay, "weight_decay": weight_decay,
             "initial_accumulator_value": initial_accumulator_value, "eps": eps, "no_decay": no_decay}
    return _make(OptimizerKind.ADAGRAD, m, hyper)


def adadelta(m: Model, lr: Lr = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0.0,
             no_decay: Any = None) -> Optimizer:
    hyper = {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay, "no_decay": no_decay}
    return _make(OptimizerKind.ADADELTA, m, hyper)


MAKERS: dict[OptimizerKind, Callable[..., Optimizer]] = {
    OptimizerKind.ADAMW: adamw, OptimizerKind.ADAM: adam, OptimizerKind.SGD: sgd,
    OptimizerKind.RMSPROP: rmsprop, OptimizerKind.ADAGRAD: adagrad, OptimizerKind.ADADELTA: adadelta}


# Set by a worker (parallel/program_handlers.py): called before each optimizer step, the first change
# a step makes, so that a step sent ahead of the controller's answer to the one before it changes
# nothing until the controller says that one went through (WorkerState.take_verdict).
# Set by a worker (parallel/worker.py): before an update, every worker's word that none failed in the
# step, and whether any found its gradients overflowed (its argument: this worker's), which it answers.
before_update: Callable[[bool], bool] | None = None


def update(m: Model, opt: Optimizer, g: Grads) -> None:
    """One optimizer step of `m` along `g`; with a loss scale (`precision mixed f16`), none where a
    worker's gradients overflowed, the scale halved (runtime/loss_scale.py)."""
    send_held()  # the records a GPU's values held back, before the model changes (runtime/sinks.py)
    scale = scale_kept(m)
    if before_update is not None and scale is None:
        before_update(False)
    if opt.model is not m:
        raise ShapeError(f"update: this {opt.kind} optimizer was made for another "
                         f"{opt.model.spec.name} model, not the one being updated "
                         f"({m.spec.name}, declared at {m.spec.where})")
    if g.model_spec is not m.spec and g.model_spec != m.spec:
        raise ShapeError(f"update: the gradients are of a {g.model_spec.name}, the model is a "
                         f"{m.spec.name} (declared at {m.spec.where})")
    params = m.params()
    g = g.synced("update")
    if scale is not None:  # every worker's word on the overflow, with its word on failures
        overflow = overflowed(g.tensors)
        if before_update is not None:
            overflow = before_update(overflow)
        if not scale.stepped(overflow):
            return  # skipped: the model and its optimizer's state as they were
    schedule = opt.schedule
    if schedule is not None:  # its lr at this position, for this update
        lr = schedule.at(opt.steps)
        for group in opt.torch_opt.param_groups:
            group["lr"] = lr
    for p, gi in zip(params, g.tensors):
        # autograd.grad may hand back a broadcast view (the gradient of a sum has strides 0), which
        # torch's fused kernels read wrongly: give them the param's own layout, as backward() does
        p.grad = gi if gi.stride() == p.stride() else gi.contiguous()
    # Ctrl-C during the step takes effect when it ends, so that a model and its optimizer state are
    # never left half-updated (a step is many tensor operations).
    held: list[FrameType | None] = []
    token = hold_ctrl_c(lambda signum, frame: held.append(frame))
    try:
        optimizer_step(opt.torch_opt)  # torch's step(), or its fused AdamW kernel alone
        opt.steps += 1
    finally:  # never leave grads behind: the next value_and_grad must not see them
        release_ctrl_c(token)
        for p in params:
            p.grad = None
        if held:
            deliver_ctrl_c(held[0])  # Python's own handler raises KeyboardInterrupt here


def ema(avg: Model, m: Model, decay: float | torch.Tensor) -> None:
    """`avg`'s params moved toward `m`'s: decay·avg + (1 − decay)·m, as torch's AveragedModel with
    get_ema_multi_avg_fn(decay) (its `lerp_`); buffers stay. On several devices every worker holds
    both models alike (or alike pieces of them), so each moves its own."""
    send_held()
    if before_update is not None:  # it changes a model: as an update, only once the step may
        before_update(False)
    if avg.spec is not m.spec and avg.spec != m.spec:
        raise ShapeError(f"ema: the average is a {avg.spec.name}, the model a {m.spec.name}")
    weight = 1 - decay
    with torch.no_grad():
        for a, p in zip(avg.params(), m.params()):
            a.lerp_(p, weight)
