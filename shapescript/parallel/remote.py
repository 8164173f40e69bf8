"""The controller's side of a program on several devices: handles to what lives on the workers,
and the calls that send each worker its part of the arguments.

Models and optimizer state stay on the workers; the controller holds `RemoteModel` and
`RemoteOptimizer` handles. A call of a function on the workers splits each argument with the
batch axis along it (as evenly as possible, the first workers taking one more), sends the rest
whole, and gives back the first worker's result, or every worker's part joined in order when the
result has the batch axis.
"""

from __future__ import annotations

import itertools
import time
import types
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from shapescript.devices import shares
from shapescript.errors import ShapeError, WorkerError
from shapescript.names import MEMBER_PREFIX
from shapescript.optimizers import OptimizerKind
from shapescript.parallel import pipeline
from shapescript.parallel.loading import OWN_SHARE, RemoteBatch, RemoteBatches
from shapescript.parallel.shared import SharedRows, share_rows
from shapescript.runtime import model as model_module
from shapescript.runtime.data import Batch, batch_fields, trusted_batch
from shapescript.runtime.model import ModelSpec, SubSpec, check_state, leaves, members_text, param_names, refuse_change
from shapescript.runtime.modes import Mode
from shapescript.runtime.optim import Settings, SettingsView, checked_change, lr_at

_handles = itertools.count(1)


class RemoteModel:
    """A model on every worker, the same on each. Reading a field copies worker 0's to the CPU.
    Every attribute of its own is in names.MODEL_RESERVED or starts with `_`, out of the members' way:
    `_pool` is the pool it was made on (stopped ones included), `_handle` its number there."""

    is_remote = True

    def __init__(self, program: Any, spec: Any, handle: int) -> None:
        self.__dict__.update(_program=program, spec=spec, _handle=handle, _pool=program._pool)
        _free_with(self, program._pool, handle)

    def _workers(self) -> Any:
        """The pool that holds this model; an error if those workers have stopped since. It never
        starts workers: what was on the old ones is gone."""
        pool = self._program._pool
        if pool is not self._pool or pool is None or not pool.alive:
            raise WorkerError(f"this {self.spec.name} was on workers that have stopped, and what was on them is "
                              f"gone: make new models, or load a checkpoint, to go on")
        return pool

    @classmethod
    def init(cls, program: Any, spec: Any, seed: int) -> RemoteModel:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"{spec.name}.init: seed must be an int, got {type(seed).__name__}")
        handle = next(_handles)
        program.workers().call("init_model", (handle, spec.name, seed), where=f"{spec.name}.init")
        return cls(program, spec, handle)

    def __getattr__(self, name: str) -> Any:
        # A member by its name from Python, or by its live name from the controller's generated code
        # (as `print(m.w)` in a loop): a whole copy either way, or a view of a sub-model.
        spec = self.__dict__.get("spec")
        if spec is None:
            raise AttributeError(name)
        return read_member(self, spec, "", name)

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_change(self, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {m.name for m in self.spec.members})

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every param and buffer, copied from worker 0."""
        return self._workers().call("state_dict", (self._handle,), where="state_dict")[0]

    def params(self) -> list[torch.Tensor]:
        """Copies of its trained params (not its buffers), in one device's order; changing them
        changes nothing on the workers."""
        state = self.state_dict()
        return [state[name] for name in param_names(self.spec)]

    def named_params(self) -> list[tuple[str, torch.Tensor]]:
        return list(zip(param_names(self.spec), self.params()))

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Strict, as one device's: every name, shape and dtype checked here first, before any worker
        hears of it; then every worker copies the tensors in (with the layout options, its part)."""
        check_state(self.spec, state, "load_state_dict")
        whole = {name: state[name].detach().cpu().contiguous() for name, _ in leaves(self.spec)}
        self._workers().call("load_state", (self._handle, whole), where="load_state_dict")

    def _make_optimizer(self, kind: OptimizerKind, hyper: dict[str, Any]) -> RemoteOptimizer:
        """adamw(m, ...), sgd(m, ...) and the others of a handle: the state is made on every worker."""
        handle = next(_handles)
        self._workers().call("make_optimizer", (handle, self._handle, kind, hyper), where=kind.maker)
        return RemoteOptimizer(self, kind, hyper, handle)

    def __repr__(self) -> str:
        # from the spec: asks the workers nothing
        devices = self._program.devices
        held = ("a piece of every param on each device" if devices.shard_params else
                f"its params with {devices.split} split along it" if devices.split else "a copy on every device")
        return f"RemoteModel[{self.spec.name}] on {devices}, {held}: {members_text(self.spec)}"


class RemoteSubModel:
    """A sub-model of a RemoteModel (`m.enc`, `m.blocks[0]`), read-only as every model is from Python:
    reading a field copies the whole param from the workers (gathered from their parts with the
    layout options), as a RemoteModel's does; a stack of sub-models reads as a tuple of these, as
    one device's reads as a tuple of models. It holds no handle of its own: it reads through its
    model's, and so stops working when that model's workers stop."""

    def __init__(self, root: RemoteModel, spec: ModelSpec, path: str) -> None:
        # `path`: the dotted prefix of its leaves in the root's state_dict, "blocks.0.attn."
        self.__dict__.update(spec=spec, _root=root, _path=path)

    def __getattr__(self, name: str) -> Any:
        own = self.__dict__  # empty in a copy being made: no attribute of its own to look up here
        if "_root" not in own:
            raise AttributeError(name)
        return read_member(own["_root"], own["spec"], own["_path"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_change(self, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {m.name for m in self.spec.members})

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Its params and buffers by dotted name within it, as one device's sub-model names them."""
        return self._root._workers().call("state_dict", (self._root._handle, self._path),
                                          where=f"state_dict of {self._path.rstrip('.')}")[0]

    def params(self) -> list[torch.Tensor]:
        """Its trained params, in the order one device's sub-model gives them."""
        state = self.state_dict()
        return [state[name] for name in param_names(self.spec)]

    def named_params(self) -> list[tuple[str, torch.Tensor]]:
        return list(zip(param_names(self.spec), self.params()))

    def __repr__(self) -> str:
        return (f"RemoteSubModel[{self.spec.name}] `{self._path.rstrip('.')}` of {self._root.spec.name} on "
                f"{self._root._program.devices}: {members_text(self.spec)}")


def read_member(root: RemoteModel, spec: ModelSpec, path: str, name: str) -> Any:
    """Member `name` of the model at `path` in `root` (spec `spec`): a whole copy of a param or
    buffer, a view of a sub-model, a tuple of views of a stack. An AttributeError for a name that
    isn't a member, so that `hasattr` says False, as on one device."""
    member_name = name.removeprefix(MEMBER_PREFIX)
    member = None if member_name.startswith("_") else next((m for m in spec.members if m.name == member_name), None)
    if member is None:
        raise AttributeError(f"model {spec.name} has no member `{name}`")
    dotted = path + member_name
    if model_module.read_check is not None:
        model_module.read_check(spec, dotted)
    if isinstance(member, SubSpec) and member.count is not None:
        return tuple(RemoteSubModel(root, member.model, f"{dotted}.{k}.") for k in range(member.count))
    if isinstance(member, SubSpec):
        return RemoteSubModel(root, member.model, f"{dotted}.")
    return root._workers().call("read", (root._handle, dotted), where=f"reading {dotted}")[0]


class RemoteOptimizer(SettingsView):
    """Optimizer state on every worker, for one RemoteModel."""

    is_remote = True

    def __init__(self, model: RemoteModel, kind: OptimizerKind, hyper: dict[str, Any], handle: int) -> None:
        self.model, self.kind, self._handle = model, kind, handle
        self._settings = Settings(hyper)
        self._lr_scheduler = None  # the controller's torch scheduler driving its lr, if any (SettingsView)
        _free_with(self, model._pool, handle)

    @property
    def steps(self) -> int:
        """The updates made, as every worker counts them (after the steps sent before)."""
        return int(self.model._workers().call("optimizer_steps", (self._handle,), where="opt.steps")[0])

    @property
    def lr(self) -> float:
        """The lr of the next update."""
        return lr_at(self._settings["lr"], self.steps)

    def set(self, **settings: Any) -> None:
        """As Optimizer.set, on every worker: checked here first, so that all of them take it or none."""
        changed = checked_change(self.kind, self._settings, settings)
        self.model._workers().call("set_optimizer", (self._handle, changed), where=f"{self.kind.maker}.set")
        self._settings = Settings({**self._settings, **changed})

    def replace_settings(self, hyper: dict[str, Any], steps: int) -> None:
        self._settings = Settings(hyper)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state by param and key (`w1.exp_avg`), whole, copied from the workers."""
        return self.model._workers().call("optimizer_state", (self._handle,), where="the optimizer's state")[0]

    def __repr__(self) -> str:
        return f"RemoteOptimizer {self.kind}[{self.model.spec.name}] on {self.model._program.devices}"


def _free_with(holder: Any, pool: Any, handle: int) -> None:
    """When `holder` is collected, its object on the workers is freed with the pool's next call.
    The finalizer holds the pool, not the holder (a reference to it would keep it alive)."""
    if pool is not None:
        weakref.finalize(holder, pool.release, handle)


def encode(value: Any) -> Any:
    """A value as it travels to a worker: handles by number, batches as their fields."""
    if isinstance(value, tuple) and value and value[0] == "batchref":
        return value  # already a worker's part of a RemoteBatch
    if isinstance(value, RemoteBatch):  # taken whole: each worker loads it, not sent the dataset
        return value._whole()
    if isinstance(value, (RemoteModel, RemoteOptimizer)):
        check_handle(value)
        return ("handle", value._handle)
    if isinstance(value, Batch):
        return ("batch", value.spec.name, batch_fields(value), value.lengths)
    if isinstance(value, torch.Tensor):  # a plain one on the CPU as it is: two torch calls fewer a call
        plain = type(value) is torch.Tensor and value.is_cpu and not value.requires_grad
        return ("tensor", value if plain else value.detach().cpu())
    if isinstance(value, SharedRows):  # a worker's rows of a big tensor, in shared memory (shared.py)
        return ("tensor", value)
    return ("value", value)


def check_handle(value: Any) -> None:
    """A WorkerError if `value` is a handle whose workers have stopped; nothing otherwise."""
    if isinstance(value, RemoteModel):
        value._workers()
    elif isinstance(value, RemoteOptimizer):
        value.model._workers()


def split_value(value: Any, axis: int | None, parts: list[int], share_memory: bool, in_place: bool = False) -> list[Any]:
    """Each worker's part of an argument: split along `axis`, or the whole for everyone. Big tensors'
    rows go through shared memory if `share_memory` (the pool's shares_memory: its workers are
    processes of this machine), else whole through the connections; `in_place`: see SplitCall."""
    if axis is None:
        return [value] * len(parts)
    if getattr(value, "is_remote", False) and hasattr(value, "_parts"):  # a RemoteBatch: indices only
        return value._parts(parts)
    if isinstance(value, Batch):
        fields = batch_fields(value)
        shared = share_rows(fields, parts, in_place) if share_memory else {}  # big fields: each worker's rows there
        pieces: dict[str, Any] = {k: shared.get(k) or torch.split(v, parts) for k, v in fields.items()}
        lengths = {k: torch.split(v, parts) for k, v in value.lengths.items()}
        return [trusted_batch(value.spec, {k: p[i] for k, p in pieces.items()}, {k: p[i] for k, p in lengths.items()})
                for i in range(len(parts))]
    if isinstance(value, torch.Tensor):
        rows = share_rows({"": value}, parts, in_place) if axis == 0 and share_memory else {}
        return rows.get("") or list(torch.split(value, parts, dim=axis))
    raise ShapeError(f"can't split a {type(value).__name__} across the devices")


def batch_size(value: Any, axis: int) -> int:
    return value.size if isinstance(value, Batch) or hasattr(value, "_parts") else int(value.shape[axis])


@dataclass(frozen=True)
class SplitCall:
    """How a call of one function is cut across the workers, as the checker decided it."""

    where: str  # the function as messages name it: "`train_step` (mlp.ss:12:1)"
    params: tuple[int | None, ...]  # per argument: the batch axis it is split along, or None (whole)
    result: int | None  # the result's batch axis, along which the workers' parts are joined
    heads: bool = False  # split along H (`split H`): each argument in N equal parts of its own axis
    # No extern fn is called (Checked.reaches_extern), so nothing keeps a worker's rows past the call:
    # it reads a big field where it lies in shared memory instead of copying it out (shared.py)
    rows_in_place: bool = False


class RemoteFunction:
    """A function on the workers, as the controller calls it: one message per worker, one answer each.
    The controller's module prints one for each fn placed on the devices (lower/targets.py); `link`
    gives its program (whatever has `workers()`), looked up at each call."""

    def __init__(self, link: Callable[[], Any], plan: SplitCall, name: str) -> None:
        self.link, self.plan, self.name = link, plan, name
        self.where = plan.where

    def heads_of(self, value: Any, axis: int | None, index: int, workers: Any) -> list[Any]:
        """Each worker's part of an argument split along H (`split H`): N equal parts of its axis."""
        world = workers.world
        if axis is None:
            return [value] * world
        size = batch_size(value, axis)
        if size % world:
            raise ShapeError(f"{self.where}: argument {index + 1} is split along its axis {axis} across the "
                             f"{world} devices (split H), but that axis has {size} entries, not a multiple of {world}")
        return split_value(value, axis, shares(size, world), workers.shares_memory, self.plan.rows_in_place)

    def __call__(self, *args: Any) -> Any:
        workers = self._workers(args)
        # The call's wall time, for the timeline (parallel/timeline.py), from before its arguments are
        # split; one that first waits for the workers to start or to load the program isn't kept.
        settled, began = workers.settled, time.perf_counter()
        messages = self._messages(workers, args)
        return self._joined(workers, args, workers.call("call", messages, where=self.where), settled, began)

    def later(self, *args: Any) -> Any:
        """The call, sent without waiting for its answer, which a Pending holds once it comes
        (parallel/pipeline.py): the controller's module calls this where its loop only logs the
        result (ir/defer.py). A call with a random mode waits, since the next call's draws follow
        from this one's."""
        if not pipeline.enabled() or any(isinstance(a, Mode) for a in args):
            return self(*args)
        workers = self._workers(args)
        settled, began = workers.settled, time.perf_counter()
        messages = self._messages(workers, args)
        result = pipeline.Pending(workers.settle)

        def answered(replies: list[Any] | None) -> None:
            if replies is None:
                result.fail()
            else:  # its time on the timeline: since it was sent, or since the step before it was answered
                result.resolve(self._joined(workers, args, replies, settled, max(began, workers.answered_at)))

        pipeline.hold_until_written(result)
        workers.submit("call", messages, self.where, answered)
        return result

    def _workers(self, args: tuple[Any, ...]) -> Any:
        for a in args:  # before workers(), which would start a new pool for a stale handle's call
            check_handle(a)
        return linked(self.link, self.where).workers()

    def _messages(self, workers: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | list[tuple[Any, ...]]:
        """The arguments of the `call` handler: one tuple for all workers, or one a worker."""
        split = [(a, k) for a, k in zip(args, self.plan.params) if k is not None]
        # A result joined from the workers' parts needs every part; a whole one only worker 0's (the
        # others answer None: program_handlers.call's `every`).
        every = self.plan.result is not None
        if not split:
            return (self.name, tuple(encode(a) for a in args), None, every)
        if self.plan.heads:  # each worker its heads of each argument; no batch is split
            columns = [self.heads_of(a, k, n, workers) for n, (a, k) in enumerate(zip(args, self.plan.params))]
            return [(self.name, tuple(encode(c[w]) for c in columns), None, every) for w in range(workers.world)]
        n = batch_size(*split[0])
        if all(isinstance(a, RemoteBatch) for a, _ in split):  # batches the workers load: one message for all
            return (self.name, tuple(encode(a._own_shares() if k is not None else a)
                                     for a, k in zip(args, self.plan.params)), OWN_SHARE, every)
        parts = shares(n, workers.world)
        sizes = {batch_size(a, k) for a, k in split}
        if len(sizes) > 1 and any(isinstance(a, Mode) for a in args):
            raise ShapeError(f"{self.where} takes batches of {' and '.join(map(str, sorted(sizes)))} rows and a mode: "
                             "its random draws are made for one batch at a time on several devices; draw with "
                             "batches of one size, or in calls of their own")
        # Each batch is cut in its own shares (two batch dims, as `[b] Ex` and `[n] Ex`, are two sizes)
        columns = [split_value(a, k, parts if k is None or batch_size(a, k) == n else shares(batch_size(a, k), workers.world),
                               workers.shares_memory, self.plan.rows_in_place)
                   for a, k in zip(args, self.plan.params)]
        # Each worker is told where its part lies in the whole batch: a random draw is the whole
        # batch's, of which each worker keeps its part's rows (runtime/modes.py).
        return [(self.name, tuple(encode(c[w]) for c in columns), (sum(parts[:w]), n), every)
                for w in range(workers.world)]

    def _joined(self, workers: Any, args: tuple[Any, ...], replies: list[Any], settled: bool, began: float) -> Any:
        results = [result for result, _, _ in replies]
        # Every worker made the same draws: the modes given advance by them, as one device's would.
        for mode, draws in zip([a for a in args if isinstance(a, Mode)], replies[0][1]):
            mode.draws = draws
        joined = torch.cat(results, dim=self.plan.result) if self.plan.result is not None else results[0]
        if settled:
            workers.timeline.add(self.where, time.perf_counter() - began, [timing for _, _, timing in replies])
        return joined


def linked(link: Callable[[], Any], where: str) -> Any:
    """The program a controller's module is linked to; a WorkerError if whoever ran the module set none."""
    program = link()
    if program is None:
        raise WorkerError(f"{where} runs on the workers, and this controller's module has none: whoever runs it "
                          f"sets its `_workers` (api.Program does; `ss.load` the program to run it)")
    return program


def controller_runtime(core: Any, link: Callable[[], Any]) -> types.SimpleNamespace:
    """The runtime as a controller's module uses it: `core`'s names, but the batches of its loops are
    loaded by the workers, each its own part (parallel/loading.py). A copy of the names, not a proxy:
    the controller's loops read them at every step."""
    def batches(dataset: Any, n: Any, spec: Any, device: Any) -> RemoteBatches:
        return RemoteBatches(linked(link, "a loop over batches"), core.batches(dataset, n, spec, device))
    return types.SimpleNamespace(**{**{name: getattr(core, name) for name in core.__all__}, "batches": batches,
                                    "write": pipeline.write})  # records wait for pending step results
