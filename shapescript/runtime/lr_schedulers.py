"""Torch's learning-rate schedulers (`torch.optim.lr_scheduler`) driving an optimizer made by
`ss.adamw`, `ss.sgd`..., on one device and on several alike, their state in checkpoints.

A torch scheduler changes the param groups of the optimizer it is given. Here it is given a stand-in,
`_Groups`: a torch optimizer in the controller with one param group holding the optimizer's settings
(the optimizer has one lr, whatever its groups; its params stay out of it, an empty tensor in
their place). After the scheduler is made (most set the first lr then) and after each of its steps,
every setting it changed in that group (the lr; OneCycleLR's and CyclicLR's betas or momentum) goes
to the optimizer through `opt.set`, which on several devices changes every worker's optimizer
after the steps sent before. So there is one scheduler whatever the device count, running the same
Python on the same numbers, and every worker takes at each update the lr one device's optimizer
takes. Before each step the group takes the optimizer's settings again, so that a scheduler that
goes on from the current lr (StepLR multiplies it) goes on from an `opt.set(lr=...)` too, as it
would from a change to a torch optimizer's group.

Its state is torch's `state_dict()`, kept in a checkpoint as JSON (runtime/checkpoint.py): numbers,
strings, bools, None, lists and dicts only, anything else refused when the scheduler is made or
saved. Loaded back, it must have the form of the state of the scheduler it goes into (the same keys,
lists and strings: one made with the same settings), and it is rebuilt in that state's Python shape
(its tuples, its dicts' int keys): what comes from a file is numbers and bools, never code.
"""

from __future__ import annotations

import copy
import numbers
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast, overload

import torch
from torch.optim.lr_scheduler import LRScheduler

from shapescript.errors import DomainError
from shapescript.optimizers import OptimizerKind
from shapescript.runtime.checkpoint import checked_scheduler_form
from shapescript.runtime.optim import KINDS, SettingsView
from shapescript.runtime.schedules import Schedule


class _Driven(Protocol):
    """What a scheduler uses of an optimizer: one device's `Optimizer` or parallel/remote.py's
    `RemoteOptimizer` (the run time imports nothing of parallel/), both SettingsViews."""

    kind: OptimizerKind
    _lr_scheduler: Callable[[], Any] | None

    @property
    def hyper(self) -> Mapping[str, Any]: ...

    @property
    def lr_scheduler(self) -> Any: ...

    def set(self, **settings: Any) -> None: ...


class _Groups(torch.optim.Optimizer):
    """What a torch scheduler drives: one param group holding an optimizer's settings, with an empty
    tensor for its params. Its `step` does nothing: the optimizer it stands for makes the updates."""

    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__([torch.zeros(0)], settings)

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        return None


class LrScheduler:
    """A torch scheduler driving the lr of an optimizer of ShapeScript's (one device's `Optimizer`
    or a `RemoteOptimizer`), as `ss.lr_scheduler` makes it. `step()`, `get_last_lr()`,
    `last_epoch`, `state_dict()` and `load_state_dict()` are torch's; `scheduler` is torch's
    scheduler itself, whose `optimizer` is the stand-in of one param group."""

    __slots__ = ("optimizer", "scheduler", "_groups", "_keys", "__weakref__")

    def __init__(self, optimizer: _Driven, scheduler: LRScheduler, groups: _Groups, keys: list[str]) -> None:
        self.optimizer = optimizer
        self.scheduler = scheduler
        self._groups = groups
        self._keys = keys  # the optimizer's settings in the group, which a step may change

    @property
    def name(self) -> str:
        """The torch scheduler's class, by module and name (a checkpoint compares it, never imports it)."""
        kind = type(self.scheduler)
        return f"{kind.__module__}.{kind.__qualname__}"

    @property
    def last_epoch(self) -> int:
        return int(self.scheduler.last_epoch)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """The torch scheduler's step (ReduceLROnPlateau's takes the metric), then the settings it
        changed set in the optimizer, from its next update on."""
        if self.optimizer.lr_scheduler is not self:
            raise DomainError(f"lr_scheduler: another scheduler drives this optimizer's lr now (ss.lr_scheduler "
                              f"made one since this {type(self.scheduler).__name__}); step that one, or chain "
                              f"several in one with torch's SequentialLR or ChainedScheduler")
        self._take_settings()
        self._groups.step()  # as torch expects before a scheduler's step (it warns otherwise)
        self.scheduler.step(*args, **kwargs)
        self._push()

    def get_last_lr(self) -> list[float]:
        """The lr the last step set (one value: the optimizer has one lr)."""
        return [float(lr) for lr in self.scheduler.get_last_lr()]

    def state_dict(self) -> dict[str, Any]:
        """torch's scheduler's state (its `state_dict()`)."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a state that `state_dict()` gave, checked as a checkpoint's: JSON's values only, in the
        form of this scheduler's own. It changes the scheduler, not the optimizer's lr (as torch's)."""
        live = self.scheduler.state_dict()
        given = plain(state, "lr_scheduler.load_state_dict: the state")
        checked_scheduler_form(given, plain(live, "the state"), "lr_scheduler.load_state_dict: `state",
                               type(self.scheduler).__name__)
        self.scheduler.load_state_dict(rebuilt(given, live))

    def entry(self) -> dict[str, Any]:
        """What a checkpoint holds of it: its class's name, its state and its param group, as JSON."""
        group = {k: v for k, v in self._groups.param_groups[0].items() if k != "params"}
        where = f"lr_scheduler: the {type(self.scheduler).__name__}'s"
        return {"class": self.name, "state": plain(self.state_dict(), f"{where} state"),
                "group": plain(group, f"{where} param group")}

    def load_entry(self, entry: dict[str, Any]) -> None:
        """A checkpoint's entry, already checked against `entry()`'s form (checkpoint.py)."""
        self.scheduler.load_state_dict(rebuilt(entry["state"], self.scheduler.state_dict()))
        group = self._groups.param_groups[0]
        group.update(rebuilt(entry["group"], {k: v for k, v in group.items() if k != "params"}))

    def _take_settings(self) -> None:
        """The group takes the optimizer's settings: a scheduler goes on from the lr it has now."""
        hyper = self.optimizer.hyper
        if isinstance(hyper["lr"], Schedule):
            raise DomainError(f"lr_scheduler: the optimizer's lr is now {hyper['lr']!r}, one of ss.schedules; a "
                              f"torch scheduler drives a number: opt.set(lr=<number>) first")
        group = self._groups.param_groups[0]
        for key in self._keys:
            group[key] = hyper[key]

    def _push(self) -> None:
        """The settings the scheduler changed in its group, set in the optimizer."""
        group, hyper = self._groups.param_groups[0], self.optimizer.hyper
        changed = {key: _setting(group[key]) for key in self._keys if _setting(group[key]) != _setting(hyper[key])}
        if not changed:
            return
        try:
            self.optimizer.set(**changed)
        except DomainError as e:
            raise DomainError(f"lr_scheduler: the {type(self.scheduler).__name__} set "
                              f"{', '.join(f'{k}={v!r}' for k, v in changed.items())}, which the optimizer refuses: "
                              f"{e}") from None

    def __repr__(self) -> str:
        return f"LrScheduler({type(self.scheduler).__name__}, last_epoch={self.last_epoch}, lr={self.get_last_lr()})"


def _setting(value: Any) -> Any:
    """A setting as the optimizer's settings hold it: a tuple for a pair (OneCycleLR's betas)."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


def lr_scheduler(opt: Any, scheduler: Callable[..., LRScheduler], /, **settings: Any) -> LrScheduler:
    """A torch scheduler driving `opt`'s lr: `scheduler` is torch's class, made with `settings`
    (`ss.lr_scheduler(opt, CosineAnnealingLR, T_max=100)`), or a function making it from the
    optimizer it is given (`ss.lr_scheduler(opt, lambda o: SequentialLR(o, [...], milestones=[5]))`).
    It drives the lr from now on (most set the first one when made), through `opt.set`; a scheduler
    made since for the same optimizer drives it instead. `ss.save` and `ss.restore` of `opt` hold
    its state while something holds it."""
    if not isinstance(opt, SettingsView):
        raise TypeError(f"lr_scheduler: expected an optimizer made by ss.adamw, ss.sgd..., not {type(opt).__name__}")
    opt = cast(_Driven, opt)
    if isinstance(opt.hyper["lr"], Schedule):
        raise DomainError(f"lr_scheduler: the optimizer's lr is {opt.hyper['lr']!r}, one of ss.schedules, which "
                          f"sets it at every update; a torch scheduler drives a number lr: make the optimizer with one")
    keys = [key for key in KINDS[opt.kind].settings if key != "no_decay"]
    groups = _Groups({key: opt.hyper[key] for key in keys})
    if isinstance(scheduler, type):
        if not issubclass(scheduler, LRScheduler):
            raise TypeError(f"lr_scheduler: {scheduler.__name__} is no torch scheduler (torch.optim.lr_scheduler's)")
        made = scheduler(groups, **settings)
    elif callable(scheduler):
        if settings:
            raise TypeError(f"lr_scheduler: {', '.join(settings)} would go to a scheduler's class; a function makes "
                            f"the scheduler itself, from the optimizer it is given: lambda o: StepLR(o, step_size=10)")
        made = scheduler(groups)
    else:
        raise TypeError(f"lr_scheduler: expected a torch scheduler's class or a function making one from an "
                        f"optimizer, not {type(scheduler).__name__}")
    if not isinstance(made, LRScheduler) or made.optimizer is not groups:
        what = "one for another optimizer" if isinstance(made, LRScheduler) else type(made).__name__
        raise TypeError(f"lr_scheduler: the function must make a torch scheduler of the optimizer it is given, "
                        f"not {what}")
    driving = LrScheduler(opt, made, groups, keys)
    driving.entry()  # a state a checkpoint can't hold is refused now, not at the first save
    driving._push()
    opt._lr_scheduler = weakref.ref(driving)
    return driving


def plain(value: Any, where: str) -> Any:
    """`value` as JSON holds it: numbers, strings, bools and None, lists (for lists and tuples) and
    dicts of them (int keys as strings). Anything else is a DomainError naming where it is."""
    try:
        return _plain(value, where)
    except RecursionError:
        raise DomainError(f"{where} is nested too deep (or holds itself) for a checkpoint") from None


def _plain(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{k}]") for k, v in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, v in value.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)) or str(key) in out:
                raise DomainError(f"{where} has the key {key!r}, which a checkpoint's JSON can't hold (its keys "
                                  f"are strings, or ints as strings, each once)")
            out[str(key)] = _plain(v, f"{where}.{key}")
        return out
    shown = (f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor)
             else f"{repr(value)[:80]}, a {type(value).__name__}")
    raise DomainError(f"{where} is {shown}, which a checkpoint can't hold: it "
                      f"keeps a scheduler's state as JSON (numbers, strings, lists), never pickled objects or code")


def rebuilt(saved: Any, live: Any) -> Any:
    """`saved` (checked to have the form of `live`'s plain JSON) in `live`'s Python shape: its dicts'
    keys and types (a Counter's int keys), its tuples. Only numbers and bools come from `saved`."""
    if isinstance(live, dict):
        made = {key: rebuilt(saved[str(key)], v) for key, v in live.items()}
        if type(live) is dict:
            return made
        fresh = copy.copy(live)  # a Counter (MultiStepLR's milestones), an OrderedDict...
        fresh.clear()
        fresh.update(made)
        return fresh
    if isinstance(live, (list, tuple)):
        items = [rebuilt(s, v) for s, v in zip(saved, live, strict=True)]
        return tuple(items) if isinstance(live, tuple) else items
    return saved
