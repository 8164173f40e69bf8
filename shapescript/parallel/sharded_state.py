"""A model whose params are in parts (`shard params`, `split H`) as one device would hold it, and
back: what the state_dict and the optimizer's state from Python, save and load do on the workers.
Every worker runs these together, since each gather is a collective; the file saved is the file one
device would write, and any checkpoint loads into each worker's parts."""

from __future__ import annotations

from typing import Any

import torch

from shapescript.optimizers import OptimizerKind
from shapescript.runtime import checkpoint
from shapescript.runtime.model import Model, copy_state, leaves
from shapescript.runtime.optim import MAKERS, Optimizer, torch_optimizer
from shapescript.runtime.sharding import this_part, whole_of, whole_state


def make_optimizer(model: Model, kind: OptimizerKind, hyper: dict[str, Any], steps: int = 0) -> Optimizer:
    """`kind`'s maker with `hyper`'s settings, given by name, at `steps` updates made."""
    made = MAKERS[kind](model, **hyper)
    made.steps = steps
    return made


def _torch_params(opt: Optimizer) -> list[torch.Tensor]:
    """The optimizer's params in torch's order, which numbers its state (`param_order`'s names)."""
    return [p for group in opt.torch_opt.param_groups for p in group["params"]]


def _per_value(value: object, param: torch.Tensor) -> bool:
    """A state tensor with one value per value of the param (AdamW's moments, SGD's momentum), as
    opposed to one for the whole param (AdamW's step count)."""
    return isinstance(value, torch.Tensor) and value.shape == param.shape


def whole_copy(model: Model, opt: Optimizer | None) -> tuple[Model, Optimizer | None]:
    """A model (and optimizer) holding everything whole, equal to these: every part gathered."""
    whole = _blank(model)
    copy_state(whole, whole_state(model))
    if opt is None:
        return whole, None
    whole_opt = make_optimizer(whole, opt.kind, dict(opt.hyper), opt.steps)
    state = opt.torch_opt.state_dict()
    per_param: dict[int, dict[str, Any]] = {}
    for index, (name, part) in enumerate(zip(opt.param_order(), _torch_params(opt))):
        values = state["state"].get(index)
        if values is not None:
            per_param[index] = {key: whole_of(model, name, v) if _per_value(v, part) else v
                                for key, v in values.items()}
    whole_opt.torch_opt.load_state_dict({"state": per_param, "param_groups": state["param_groups"]})
    return whole, whole_opt


def _blank(model: Model) -> Model:
    """A whole model of the same spec on the same device, its values to be copied in."""
    params = model.params()
    return Model.init(model.spec, 0, params[0].device if params else "cpu")


def save(path: str, model: Model, opt: Optimizer | None, rank: int, scheduler: dict[str, Any] | None = None) -> None:
    """Every worker gathers the parts; worker 0 writes the file one device would write (`scheduler`:
    checkpoint.save_for's)."""
    whole, whole_opt = whole_copy(model, opt)
    if rank == 0:
        checkpoint.save_for(path, whole, whole_opt, scheduler)


def load(path: str, model: Model, opt: Optimizer | None, scheduler: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Load a checkpoint of the whole model into this worker's parts, every check made on the whole
    first: on any mismatch nothing is changed. The file's scheduler entry, as checkpoint.load_for."""
    whole = _blank(model)
    whole_opt = make_optimizer(whole, opt.kind, dict(opt.hyper)) if opt is not None else None
    entry = checkpoint.load_for(path, whole, whole_opt, scheduler)
    fresh = None
    if opt is not None and whole_opt is not None:
        fresh = torch_optimizer(opt.kind, model, whole_opt.hyper, whole_opt.steps)
        state = whole_opt.torch_opt.state_dict()
        names, params = whole_opt.param_order(), _torch_params(whole_opt)
        per_param = {index: {key: this_part(model, names[index], v) if _per_value(v, params[index]) else v
                             for key, v in values.items()} for index, values in state["state"].items()}
        fresh.load_state_dict({"state": per_param, "param_groups": state["param_groups"]})
    with torch.no_grad():
        for name, _ in leaves(model.spec):
            model._leaf(name).copy_(this_part(model, name, whole._leaf(name)))
    if opt is not None and fresh is not None and whole_opt is not None:
        opt.torch_opt = fresh
        opt.replace_settings(whole_opt.hyper, whole_opt.steps)
    return entry
