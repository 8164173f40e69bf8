"""Gradients and optimizers: thin wrappers over torch.autograd and torch.optim.

The maths is torch's own (AdamW, SGD); this module only keeps a model, its optimizer and its
gradients aligned by the order of `Model.params()`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, Protocol, cast

import torch

from shapescript.errors import DomainError, ShapeError
from shapescript.names import similar
from shapescript.runtime.collectives import BucketedAverage, average_grads, bucketed_average
from shapescript.runtime.fused_step import optimizer_step
from shapescript.runtime.model import Model, ModelSpec, leaves, param_names, type_text
from shapescript.runtime.sharding import keeping_pieces, sharding
from shapescript.runtime.sigint import deliver_ctrl_c, hold_ctrl_c, release_ctrl_c
from shapescript.runtime.steps import between_steps


class Grads:
    """The gradients of a model's trained params, aligned with `model.params()`. `pieces`: for each,
    whether each worker holds a part of it (`shard params`, `split H`), so that a norm adds up every
    worker's squares of them; () where every worker holds them all."""

    __slots__ = ("model_spec", "tensors", "pieces")

    def __init__(self, model_spec: ModelSpec, tensors: list[torch.Tensor], pieces: tuple[bool, ...] = ()) -> None:
        self.model_spec = model_spec
        self.tensors = tensors
        self.pieces = pieces

    def named(self) -> dict[str, torch.Tensor]:
        return dict(zip(param_names(self.model_spec), self.tensors))

    def __repr__(self) -> str:
        return f"Grads[{self.model_spec.name}]({', '.join(param_names(self.model_spec))})"


def value_and_grad(f: Callable[..., torch.Tensor], m: Model, *args: Any, where: str = "value_and_grad"
                   ) -> tuple[torch.Tensor, Grads]:
    """`f(m, *args)` and its gradient with respect to `m`'s trained params."""
    params = m.params()
    pieces = sharding(m)
    # A whole model's gradients are averaged as the backward makes them (None: after it)
    buckets = bucketed_average(params, where) if pieces is None else None
    grad_was = torch.is_grad_enabled()
    torch._C._set_grad_enabled(True)  # as torch.enable_grad(), without a context object every step
    try:
        if pieces is None:
            v, grads = _differentiate(f, m, args, params, buckets)
        else:
            with keeping_pieces(m):
                v, grads = _differentiate(f, m, args, params, None)
    finally:
        torch._C._set_grad_enabled(grad_was)
    tensors = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
    if pieces is None:
        mean = buckets.finish(tensors) if buckets is not None else average_grads(tensors, where)
        return v.detach(), Grads(m.spec, mean)
    # A part's gradient is already every worker's (a reduce-scatter, or its own heads'): N times its
    # share of the whole batch's, as each worker's loss seeds it with 1. A whole param's is averaged.
    whole = average_grads([t for t, part in zip(tensors, pieces.parted) if not part], where)
    averaged = iter(whole)
    out = [t / pieces.world if part else next(averaged) for t, part in zip(tensors, pieces.parted)]
    return v.detach(), Grads(m.spec, out, pieces.parted)


def _differentiate(f: Callable[..., torch.Tensor], m: Model, args: tuple, params: list[torch.Tensor],
                   buckets: BucketedAverage | None) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]:
    """`f(m, *args)`, checked to be a float scalar, and its gradients (None where a param has none)."""
    v = f(m, *args)
    if not isinstance(v, torch.Tensor) or v.ndim != 0 or not v.is_floating_point():
        what = (f"a {type_text(v.shape, v.dtype)} tensor" if isinstance(v, torch.Tensor)
                else f"a {type(v).__name__}")
        raise ShapeError(f"value_and_grad: {getattr(f, '__name__', 'the function')} returned "
                         f"{what}, expected a float scalar []")
    if not (v.requires_grad and params):  # v does not depend on any param: autograd.grad would refuse
        return v, (None,) * len(params)
    if buckets is None:
        return v, torch.autograd.grad(v, params, allow_unused=True)
    with buckets:
        return v, torch.autograd.grad(v, params, allow_unused=True)


class Optimizer:
    """A torch optimizer bound to one model; `kind` is the .ss type's name.

    Its torch param groups: one with every trained param, or, when `hyper["no_decay"]` names
    some, the others first (with the optimizer's weight decay) and those second (with none), as
    nanoGPT and most transformer recipes group them."""

    __slots__ = ("kind", "model", "torch_opt", "hyper")

    def __init__(self, kind: str, model: Model, torch_opt: torch.optim.Optimizer,
                 hyper: dict[str, Any]) -> None:
        self.kind = kind
        self.model = model
        self.torch_opt = torch_opt
        self.hyper = hyper

    def param_order(self) -> list[str]:
        """The params' dotted names in torch's order: its state_dict numbers them this way."""
        return grouped_names(self.model.spec, self.hyper.get("no_decay", ()))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state by param and key (`w1.exp_avg`), as detached copies: what a checkpoint holds
        under `opt.`."""
        with between_steps():  # a background run's step changes it in place
            return named_state(self)[0]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hyper.items() if k != "no_decay" or v)
        return f"{self.kind}[{self.model.spec.name}]({args})"


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
            hint = similar(str(name), names)
            raise DomainError(f"{kind.lower()}: no_decay names {name!r}, which is no trained param of "
                              f"{spec.name} (declared at {spec.where}){'; ' + hint if hint else ''}")
    return [n for n in names if n in set(choice)]


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


# Each optimizer's settings as ss.adamw / ss.sgd take them, and what each may be: the checks both
# those functions and a checkpoint's header go through (torch checks fewer, and some too late).
HYPER_RULES: dict[str, dict[str, Callable[[Any], Any]]] = {
    "AdamW": {"lr": _rate, "betas": _betas, "eps": _rate, "weight_decay": _rate, "no_decay": _names},
    "Sgd": {"lr": _rate, "momentum": _rate, "weight_decay": _rate, "nesterov": _flag, "no_decay": _names},
}
EXTRA_RULES: dict[str, Callable[[Any], Any]] = {"dampening": _rate}  # torch's own, in a param group


def checked_hyper(kind: str, hyper: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`hyper` (some of `kind`'s settings in HYPER_RULES, or EXTRA_RULES), each checked and made a
    float, a pair of floats or a bool. DomainError "{where}{name} must be ..., not {value!r}"."""
    rules = {**HYPER_RULES[kind], **EXTRA_RULES}
    out = {}
    for name, value in hyper.items():
        try:
            out[name] = rules[name](value)
        except ValueError as e:
            raise DomainError(f"{where}{name} must be {e}, not {_setting_text(value)}") from None
    if out.get("nesterov") and not (out.get("momentum", 1.0) > 0 and out.get("dampening", 0.0) == 0):
        raise DomainError(f"{where}nesterov can be True only with a momentum > 0 and no dampening")
    return out


TORCH_KINDS: dict[str, type[torch.optim.Optimizer]] = {"AdamW": torch.optim.AdamW, "Sgd": torch.optim.SGD}

# Set by runtime/recorded.py, which records steps on cuda devices: whether an optimizer of params on
# this device is made capturable. Nothing records in a standalone build: none is.
def _never(device: torch.device) -> bool:
    return False


capturable_on: Callable[[torch.device], bool] = _never


def _make(kind: str, m: Model, hyper: dict[str, Any]) -> Optimizer:
    remote = getattr(m, "is_remote", False)
    if not remote and not isinstance(m, Model):
        raise TypeError(f"{kind.lower()}: expected a model, got {type(m).__name__}")
    hyper = checked_hyper(kind, {**hyper, "no_decay": no_decay_names(m.spec, hyper["no_decay"], kind)},
                          f"{kind.lower()}: ")
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


def torch_optimizer(kind: str, m: Model, hyper: Mapping[str, Any]) -> torch.optim.Optimizer:
    """torch's optimizer of `kind` for `m`, with `hyper`'s settings and param groups."""
    settings = {k: v for k, v in hyper.items() if k != "no_decay"}
    params = m.params()
    # Recorded steps capture AdamW's step, which needs its step count on the device; SGD keeps none.
    capturable = kind == "AdamW" and bool(params) and capturable_on(params[0].device)
    if capturable:
        settings["capturable"] = True
    elif params and params[0].device.type == "cpu" and all(p.is_contiguous() for p in params):
        # torch's fused kernels on cpu: one pass over each param instead of a dozen tensor ops
        # (AdamW on the README's MLP 77 µs a step against 458; SGD's results are bitwise the same,
        # AdamW's within rounding). See docs/benchmarks.md.
        settings["fused"] = True
    made = TORCH_KINDS[kind](torch_groups(m, hyper), **settings)
    if capturable:  # torch's warning that such a step is slower uncaptured: warm-ups are so by design
        made._warned_capturable_if_run_uncaptured = True
    return made


def adamw(m: Model, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
          eps: float = 1e-8, weight_decay: float = 1e-2, no_decay: Any = None) -> Optimizer:
    hyper = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "no_decay": no_decay}
    return _make("AdamW", m, hyper)


def sgd(m: Model, lr: float = 1e-3, momentum: float = 0.0, weight_decay: float = 0.0,
        nesterov: bool = False, no_decay: Any = None) -> Optimizer:
    hyper = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "nesterov": nesterov,
             "no_decay": no_decay}
    return _make("Sgd", m, hyper)


# Set by a worker (parallel/program_handlers.py): called before each optimizer step, the first change
# a step makes, so that a step sent ahead of the controller's answer to the one before it changes
# nothing until the controller says that one went through (WorkerState.take_verdict).
before_update: Callable[[], None] | None = None


def update(m: Model, opt: Optimizer, g: Grads) -> None:
    """One optimizer step of `m` along `g`."""
    if before_update is not None:
        before_update()
    if opt.model is not m:
        raise ShapeError(f"update: this {opt.kind} optimizer was made for another "
                         f"{opt.model.spec.name} model, not the one being updated "
                         f"({m.spec.name}, declared at {m.spec.where})")
    if g.model_spec is not m.spec and g.model_spec != m.spec:
        raise ShapeError(f"update: the gradients are of a {g.model_spec.name}, the model is a "
                         f"{m.spec.name} (declared at {m.spec.where})")
    params = m.params()
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
    finally:  # never leave grads behind: the next value_and_grad must not see them
        release_ctrl_c(token)
        for p in params:
            p.grad = None
        if held:
            deliver_ctrl_c(held[0])  # Python's own handler raises KeyboardInterrupt here
