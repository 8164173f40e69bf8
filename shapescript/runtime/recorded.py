"""Recorded steps: a step of a function in the module's `RECORDABLE` table
(lower/recording.py) captured once as a CUDA graph and then replayed, so that a step costs one
launch, its NCCL all-reduces included, rather than a launch per kernel.

A function's calls are told apart by their signature: which models and optimizers they change, the
shapes and dtypes of their batches' fields and tensors, their plain values, and the optimizer's
settings (a graph holds the learning rate it was captured with). After `WARMUP` eager calls in a row
with one signature, on a side stream as torch's recipe has it (libraries set themselves up there
and the optimizer makes its state), the next call is captured: its batch is copied into buffers the
graph keeps, the graph is captured on the same side stream (capture runs no kernel), then replayed
for that call's step. A later call with the same signature copies its batch into those buffers and
replays; its result is a copy of the graph's output. A call with another signature runs eagerly
(a last, smaller batch), and one that keeps coming is captured in its turn, replacing the graph.

Capture failing (an op that waits for the device, as `.item()` does) makes the function run eagerly
for good, the reason kept (`report`); the device's random generator is left as it was before the
capture (torch leaves it in capture mode, where the next random op raises). On several workers a captured NCCL collective launches only
when every worker launches its graph, so after each capture the workers agree, with one all-reduce,
whether every one of them captured it; if one didn't, none replays. The workers take the same
decisions, call by call, from the same calls (their parts of a batch have the same shape for the
same whole batch), so they reach each capture together.

Not recorded: while collectives are being recorded (`collectives.recorded`, the DeviceTable's
tests: a replay would record nothing), during someone else's capture, and anything not on a cuda
device. `SHAPESCRIPT_RECORD=off` turns recording off (A/B runs, and a way back), read when a
process starts, as `SHAPESCRIPT_OVERLAP` is; optimizers are then made as before.

Calls reach a recorder from Python (api.Function), from the controller (program_handlers, a
worker's call), and from the module's own code (`step`: a loop's call of a step, where the
lowering printed it so). `program_report` says, per recordable fn of a module, what became of it.

Python that runs in a step runs at capture only: the worker's status and the timeline's clock are
told nothing during a capture or a replay (a recorded step's collectives are inside the graph, so
the timeline counts them as computing).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from shapescript.runtime import collectives, optim, sinks
from shapescript.runtime.data import Batch, trusted_batch
from shapescript.runtime.model import Model
from shapescript.runtime.modes import Mode
from shapescript.runtime.optim import KINDS, Optimizer

RECORD_ENV = "SHAPESCRIPT_RECORD"
# On unless SHAPESCRIPT_RECORD=off, read once per process.
enabled: bool = os.environ.get(RECORD_ENV, "on").strip().lower() not in ("off", "0", "no", "false")
WARMUP = 3  # eager calls in a row with one signature before its capture: torch's recipe warms up 3


def may_record(device: torch.device) -> bool:
    """Whether steps on `device` may be recorded; optimizers for it are made capturable (optim.py)."""
    return enabled and device.type == "cuda"


optim.capturable_on = may_record


class Graph(Protocol):
    """What a recorder captures into: torch's CUDA graph (`CudaGraph`), or a test's stand-in."""

    def capture(self, run: Callable[[], Any]) -> Any:
        """Capture `run()` and return its outputs, which every replay refills in place."""

    def replay(self) -> None: ...


GraphMaker = Callable[[torch.device, "torch.cuda.Stream | None"], Graph]


class CudaGraph:
    """A torch.cuda.CUDAGraph captured on the recorder's side stream, where the warm-up ran (cuBLAS
    and its kin keep a handle per stream: one made during capture would fail it). Capture errors
    only for unsafe calls of this thread ("thread_local"): a worker's loading threads go on copying
    batches from pinned memory meanwhile, as torch.compile's graphs allow theirs."""

    def __init__(self, device: torch.device, stream: torch.cuda.Stream | None) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.device, self.stream = device, stream

    def capture(self, run: Callable[[], Any]) -> Any:
        was = torch.cuda.current_stream(self.device)
        generator = default_generator(self.device)
        before = generator.clone_state()  # its seed and offset, in a state object of its own
        try:
            with torch.cuda.device(self.device), torch.cuda.graph(self.graph, stream=self.stream,
                                                                  capture_error_mode="thread_local"):
                return run()
        except BaseException:
            # capture_begin put the device's generator in capture mode, and only a capture_end that
            # succeeds takes it out; after a failed one every random op raises "Offset increment
            # outside graph capture encountered unexpectedly". Give the generator back its state from
            # before the capture (a failed capture drew nothing from it): a fresh one, not capturing.
            generator.graphsafe_set_state(before)
            raise
        finally:  # torch.cuda.graph leaves its stream current when ending a failed capture raises
            torch.cuda.set_stream(was)

    def replay(self) -> None:
        self.graph.replay()


def default_generator(device: torch.device) -> torch.Generator:
    """The generator random ops on `device` draw from when given none: the one a capture registers."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.default_generators[index]


def agree_across_workers(ok: bool, device: torch.device, where: str) -> bool:
    """Whether every worker captured its step: one all-reduce (min) of each one's flag."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    with collectives.waiting_at(where):
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


Agree = Callable[[bool, torch.device, str], bool]

# -- a call's signature --------------------------------------------------------------------------


def _settings(torch_opt: torch.optim.Optimizer) -> tuple[Any, ...]:
    """An optimizer's settings, group by group (lr, betas, ...), as captured into its step."""
    return tuple(tuple(v for k, v in g.items() if k != "params") for g in torch_opt.param_groups)


def _tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.shape, t.dtype, t.device)


def signature(values: Sequence[Any], extra: Any = None) -> tuple[Any, ...] | str:
    """What a call's graph depends on, or why a call can't be recorded. Models and optimizers by
    identity (the step changes their tensors in place; their state's count, which the first step
    makes), batches and tensors by shape, dtype and device, plain values by value."""
    parts: list[Any] = [extra]
    for v in values:
        if isinstance(v, torch.Tensor):
            parts.append(_tensor_key(v))
        elif isinstance(v, Batch):
            if type(v) is not Batch:
                return f"takes a value of type {type(v).__name__}"
            fields = tuple(_tensor_key(v.__dict__[f.name]) for f in v.spec.fields)
            lengths = tuple((k, _tensor_key(t)) for k, t in v.lengths.items())
            parts.append((id(v.spec), fields, lengths))
        elif isinstance(v, Model):
            parts.append(("model", id(v)))
        elif isinstance(v, Mode):
            return "takes a Mode, whose random draws are counted in Python"
        elif isinstance(v, Optimizer):
            if v.schedule is not None:  # a graph would replay the lr it captured
                return "takes an optimizer whose lr follows a schedule, set before each update"
            if "step" in KINDS[v.kind].state and not KINDS[v.kind].capturable:
                return f"takes a {v.kind} optimizer, which counts its steps on the CPU"
            parts.append(("optimizer", id(v), id(v.torch_opt), len(v.torch_opt.state), _settings(v.torch_opt)))
        elif v is None or isinstance(v, (bool, int, float, str)):
            parts.append((type(v), v))
        else:
            return f"takes a value of type {type(v).__name__}"
    return tuple(parts)


def _owners(values: Sequence[Any]) -> list[weakref.ref[Any]]:
    """Weak references to the objects a signature names by identity: a graph is replayed only while
    each is alive (another object at a dead one's address would match its id)."""
    refs: list[weakref.ref[Any]] = []
    for v in values:
        if isinstance(v, Model):
            refs.append(weakref.ref(v))
        elif isinstance(v, Optimizer):
            refs += [weakref.ref(v.model), weakref.ref(v.torch_opt)]
    return refs


# -- inputs and outputs --------------------------------------------------------------------------


def _input_tensors(values: Sequence[Any]) -> Iterator[torch.Tensor]:
    """The tensors a call brings with it, in order: its tensors and its batches' fields and lengths."""
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, Batch):
            yield from (v.__dict__[f.name] for f in v.spec.fields)
            yield from v.lengths.values()


def _static_copy(v: Any) -> Any:
    """A value whose tensors are the graph's own buffers, holding `v`'s values."""
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, Batch):
        fields = {f.name: v.__dict__[f.name].clone() for f in v.spec.fields}
        return trusted_batch(v.spec, fields, {k: t.clone() for k, t in v.lengths.items()})
    return v


def _output_problem(out: Any) -> str:
    """Why a result can't be handed back as copies of the graph's outputs, or ""."""
    if isinstance(out, tuple):
        return next((p for p in map(_output_problem, out) if p), "")
    if out is None or isinstance(out, (torch.Tensor, bool, int, float, str)):
        return ""
    return f"returns a {type(out).__name__}"


def _copied(out: Any) -> Any:
    """The result handed back: copies, since the next replay refills the graph's outputs."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(_copied(o) for o in out)
    return out


def output_tensors(out: Any) -> Iterator[torch.Tensor]:
    """The tensors of a result: itself, or those of a tuple, nested ones included."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, tuple):
        for o in out:
            yield from output_tensors(o)


# -- the recorder --------------------------------------------------------------------------------


@dataclass(eq=False)
class Recorded:
    """One captured step: its graph, the buffers it reads its inputs from, its outputs."""

    key: tuple[Any, ...]
    graph: Graph
    inputs: list[torch.Tensor]
    outputs: Any
    owners: list[weakref.ref[Any]]

    def alive(self) -> bool:
        return all(ref() is not None for ref in self.owners)

    def replay(self, values: Sequence[Any]) -> Any:
        for buffer, value in zip(self.inputs, _input_tensors(values)):
            buffer.copy_(value)
        self.graph.replay()
        return _copied(self.outputs)


@dataclass(eq=False)
class _Fn:
    """A function's recording: why it runs eagerly for good, its calls' last signature and how many
    calls in a row had it, and its captured step."""

    name: str
    refused: str = ""
    key: Any = None
    streak: int = 0
    step: Recorded | None = None
    replays: int = 0  # calls its graphs ran, for the report

    def state(self, warmup: int) -> str:
        """"recorded (replays 120)", "not recorded: <why>", or how far its warm-up is."""
        if self.refused:
            return f"not recorded: {self.refused}"
        if self.step is not None:
            return f"recorded (replays {self.replays})"
        return f"warming up ({self.streak} of {warmup} calls)"


class Recorder:
    """The recorded steps of one device's functions. `graphs` makes a graph (CudaGraph; a test's
    stand-in), `agree` is how workers agree on a capture (several workers only)."""

    def __init__(self, device: torch.device, graphs: GraphMaker = CudaGraph, agree: Agree = agree_across_workers,
                 warmup: int = WARMUP) -> None:
        self.device, self.graphs, self.agree, self.warmup = device, graphs, agree, warmup
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.world: Callable[[], int] = collectives.world  # how many workers run each step
        # By function object, so that a program loaded again starts afresh and a dead one's go.
        self.fns: weakref.WeakKeyDictionary[Callable[..., Any], _Fn] = weakref.WeakKeyDictionary()

    def call(self, name: str, fn: Callable[..., Any], values: Sequence[Any], extra: Any = None) -> Any:
        """`fn(*values)`, recorded where it can be. `extra`: anything else the step depends on (a
        worker's part of the batch)."""
        sinks.send_held()  # a replay changes the models: the records held before it go first
        entry = self.fns.get(fn)
        if entry is None:
            entry = self.fns[fn] = _Fn(name)
        if entry.refused or collectives.recorded is not None or self._capturing():
            return fn(*values)
        key = signature(values, extra)
        if isinstance(key, str):
            entry.refused = key
            return fn(*values)
        step = entry.step
        if step is not None and step.key == key:
            if step.alive():
                entry.key = key  # a smaller batch between two replays doesn't start a streak
                entry.replays += 1
                return step.replay(values)
            entry.step = None  # its model or optimizer is gone: its graph goes too
        entry.streak = entry.streak + 1 if key == entry.key else 1
        entry.key = key
        if entry.streak <= self.warmup:
            return self._warm_up(fn, values)
        return self._capture(entry, fn, values, key)

    def _capturing(self) -> bool:
        return self.stream is not None and torch.cuda.is_current_stream_capturing()

    def _warm_up(self, fn: Callable[..., Any], values: Sequence[Any]) -> Any:
        """An eager call on the side stream, ordered with the current stream's work both ways."""
        if self.stream is None:
            return fn(*values)
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        try:
            with torch.cuda.stream(self.stream):
                out = fn(*values)
        finally:
            current.wait_stream(self.stream)
        for t in output_tensors(out):
            t.record_stream(current)  # made on the side stream, used on the current one
        return out

    def _capture(self, entry: _Fn, fn: Callable[..., Any], values: Sequence[Any], key: tuple[Any, ...]) -> Any:
        """Capture this call's step, agree on it, and run the step: replayed, or eagerly."""
        entry.step = None  # the graph of another signature, if any, goes before this one is made
        static = [_static_copy(v) for v in values]
        graph = self.graphs(self.device, self.stream)
        hooks = collectives.status_hook, collectives.operation_hook
        collectives.status_hook = collectives.operation_hook = None  # a worker's status and clock
        try:
            outputs = graph.capture(lambda: fn(*static))
            problem = _output_problem(outputs)
        except Exception as e:
            outputs, problem = None, f"capture failed: {type(e).__name__}: {e}"
        finally:
            collectives.status_hook, collectives.operation_hook = hooks
        everyone = not problem
        if self.world() > 1:
            everyone = self.agree(not problem, self.device, f"recording `{entry.name}`")
        if not everyone:
            entry.refused = problem or "another worker couldn't record it"
            entry.step = None
            return fn(*values)  # this call's step, eagerly: none is lost
        inputs = list(_input_tensors(static))
        entry.step = Recorded(key, graph, inputs, outputs, _owners(values))
        entry.replays += 1
        graph.replay()
        return _copied(outputs)

    def report(self) -> dict[str, str]:
        """Each function's recording, in words: for `%shapescript status` and anyone asking why."""
        return {entry.name: entry.state(self.warmup) for entry in self.fns.values()}

    def state_of(self, fn: Callable[..., Any]) -> str:
        """`fn`'s recording, in words; "not called yet" before its first call here."""
        entry = self.fns.get(fn)
        return "not called yet" if entry is None else entry.state(self.warmup)


_recorders: dict[str, Recorder | None] = {}


def recorder_for(device: torch.device | str) -> Recorder | None:
    """The process's recorder for `device`, or None where its steps aren't recorded."""
    name = str(device)
    if name not in _recorders:
        where = torch.device(name)
        _recorders[name] = Recorder(where) if may_record(where) else None
    return _recorders[name]


def for_program(namespace: dict[str, Any], fn: Callable[..., Any]) -> Recorder | None:
    """The recorder for a call of `fn` of a one-device module, or None: a fn not in its RECORDABLE
    table (a cpu program's module has none, nor has a controller's, whose fns are the workers')."""
    table = namespace.get("RECORDABLE")
    if not table or getattr(fn, "__name__", None) not in table:
        return None
    return recorder_for(namespace["DEVICE"])


def step(device: str, name: str, fn: Callable[..., Any], values: Sequence[Any]) -> Any:
    """`fn(*values)` through `device`'s recorder: a RECORDABLE fn's call from a fn of its module that
    no recorded step runs (a loop over a Dataset), as lower/recording.py says and codegen prints.
    One dict lookup finds the recorder; a worker's step tells it its part of the batch, as a call
    from the controller does (program_handlers._run)."""
    recorder = _recorders[device] if device in _recorders else recorder_for(device)
    if recorder is None:
        return fn(*values)
    return recorder.call(name, fn, values, collectives.batch_part())


OFF = f"not recorded: recording is off ({RECORD_ENV}=off)"


def program_report(namespace: dict[str, Any]) -> dict[str, str]:
    """The recording of each fn in a module's RECORDABLE table, by the name the module binds it to,
    on the module's device; {} for a module with no table (cpu, a controller's)."""
    table = namespace.get("RECORDABLE")
    if not table:
        return {}
    where = torch.device(namespace["DEVICE"])
    recorder = _recorders.get(str(where))  # asking makes none: a recorder is made by a first call
    if recorder is not None:
        return {name: recorder.state_of(namespace[name]) for name in table}
    if may_record(where):
        return {name: "not called yet" for name in table}
    return {name: OFF if where.type == "cuda" else "not recorded: not on a cuda device" for name in table}


def report() -> dict[str, dict[str, str]]:
    """Every device's recording, by device and function."""
    return {device: r.report() for device, r in _recorders.items() if r is not None}
