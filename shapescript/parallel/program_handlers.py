"""What a worker does for a program: run its compiled code, keep its models and optimizers by
handle, and answer the controller's calls. Workers receive the compiled Python, never the
controller's script, and run only the functions the checker placed on the devices."""

from __future__ import annotations

import random
import sys
from contextlib import nullcontext
from typing import Any

import torch

from shapescript.names import spec_var
from shapescript.optimizers import OptimizerKind
from shapescript.parallel import loading, sharded_state, shared
from shapescript.parallel.handlers import handler
from shapescript.parallel.timeline import timed, wired
from shapescript.runtime import calls, checkpoint, collectives, optim, recorded, sharding
from shapescript.runtime.data import TensorDataset, trusted_batch
from shapescript.runtime.ledger import Ledger, kind_of
from shapescript.runtime.model import Model, leaves
from shapescript.runtime.modes import Mode, stream_key
from shapescript.runtime.optim import Optimizer
from shapescript.runtime.steps import StepSkipped

# Mixed into the program's seed for the workers' random states, so that they are other streams than
# `Train(seed=...)`'s draws of the same number (modes.stream_key).
EXTERN_STREAMS = 0xE47E_2D5F_0000_0000


@handler("load_program")
def load_program(state: Any, source: str, module_file: str, device_name: str, script: str | None,
                 seed: int) -> None:
    """Run the program's worker module (lower/targets.py's WORKER target, one device's module) as
    printed; only the device it runs on is this worker's own. `seed`: the program's, which this
    worker's random states are seeded from (`seed_random_states`)."""
    namespace: dict[str, Any] = {"__name__": "shapescript_worker_program"}
    exec(compile(source, module_file, "exec"), namespace)  # our own compiled code, from the controller
    namespace["DEVICE"] = str(state.device)
    calls.preload_externs(namespace["EXTERN_TARGETS"], script)
    seed_random_states(seed, state.rank)
    state.program = namespace
    LEDGER.clear()
    collectives.status_hook = state.waiting_at
    collectives.operation_hook = state.clock.operation
    optim.before_update = state.before_update


def seed_random_states(seed: int, rank: int) -> None:
    """Seed the random states an extern fn may draw from on this worker (torch's, on the CPU and
    every CUDA device, Python's `random` and NumPy's global one) with a stream of its own, keyed by
    the program's seed and the worker's rank: the workers, forked from one process, would
    otherwise all start from its state and draw the same numbers for their own rows."""
    key = stream_key(seed ^ EXTERN_STREAMS, rank)
    torch.manual_seed(key)
    random.seed(key)
    numpy = sys.modules.get("numpy")  # loaded with torch where it is installed; never imported here
    if numpy is not None:
        numpy.random.seed([key & 0xFFFF_FFFF, key >> 32])


@handler("init_model")
def init_model(state: Any, handle: int, model: str, seed: int) -> None:
    """Every worker draws the same model, and keeps its part of each param the layout options cut:
    along H (`split H`), or a flat piece (`shard params`)."""
    spec = state.program[spec_var(model)]
    pieces, heads = bool(state.program.get("SHARD_PARAMS")), state.program.get("HEAD_PARAMS", {})
    if (pieces or heads) and state.world > 1:
        state.objects[handle] = sharding.init_parts(spec, seed, state.device, state.rank, state.world, pieces, heads)
    else:
        state.objects[handle] = Model.init(spec, seed, state.device)


@handler("make_optimizer")
def make_optimizer(state: Any, handle: int, model: int, kind: OptimizerKind, hyper: dict[str, Any]) -> None:
    state.objects[handle] = sharded_state.make_optimizer(state.objects[model], kind, hyper)


@handler("keep_dataset")
def keep_dataset(state: Any, handle: int, base: Any, spec: str) -> None:
    state.objects[handle] = loading.keep(state, base, state.program[spec_var(spec)])


LOOPS = loading.WorkerLoops()  # this worker's loops over batches
LEDGER = Ledger()  # the collectives of each kind of call, for a call that fails on this worker alone

SKIPPED = "skipped: another worker couldn't load its part of the batch"


def decode(state: Any, value: Any) -> Any:
    kind = value[0]
    if kind == "handle":
        return state.objects[value[1]]
    if kind == "batchref":
        _, plan, number, start, size = value
        return LOOPS.get(state, plan).take(number, start, size)
    if kind == "batch":
        _, spec, fields, lengths = value
        move = {k: shared.arrive(v, state.device) for k, v in fields.items()}  # a big field from shared memory
        return trusted_batch(state.program[spec_var(spec)], move, {k: v.to(state.device) for k, v in lengths.items()})
    if kind == "tensor":
        return shared.arrive(value[1], state.device)
    return value[1]


def to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, tuple):
        return tuple(to_cpu(v) for v in value)
    return value


@handler("call")
def call(state: Any, name: str, args: tuple, part: tuple[int, int] | str | None = None, every: bool = True) -> Any:
    """Run `name` on this worker's arguments; `part` is where its part lies in the whole batch
    (offset, the whole batch's size), or loading.OWN_SHARE when the worker works it out from its
    batchrefs (then every worker got the same message). Answers the result, for each Mode argument in order the count
    of draws it has made, so that the controller's mode advances as one device's would, and the
    call's WorkerTiming for the timeline (parallel/timeline.py; None where timing is off).
    `every`: whether every worker answers its result (one split along the batch axis, joined from
    the parts); otherwise worker 0 alone answers the result and the draws (the same on every worker:
    the controller reads worker 0's), and the others None for both, which spares copying, pickling and
    reading a result no one reads."""
    where = _own_part(state, args) if isinstance(part, str) else part  # str: loading.OWN_SHARE
    with timed(state.clock):
        answer = _run(state, name, args, where, every or state.rank == 0)
    state.take_verdict()  # a chained step that changed nothing (no update) waits for it here
    return (*answer, wired(state.clock.take()))


def _own_part(state: Any, args: tuple) -> tuple[int, int]:
    """Where this worker's part lies in the whole batch (its offset, the whole's size), for a call
    whose batches are batchrefs to each worker's own share."""
    _, plan, number, _, _ = next(a for a in args if a[0] == "batchref")
    loop = LOOPS.get(state, plan)
    return loop.my_share(number)[0], loop.whole_size(number)


def _run(state: Any, name: str, args: tuple, part: tuple[int, int] | None, answer: bool) -> Any:
    fn = state.program[name]
    loads = [k for k, a in enumerate(args) if a[0] == "batchref" and loading.needs_agreement(state, a[1])]
    agreeing = bool(loads) and state.world > 1
    plans = [args[k][1] for k in loads]
    try:
        with state.clock.loading():  # the timeline's data: batches loaded (or awaited from the prefetch)
            values = [decode(state, a) for a in args]
    except Exception:
        if agreeing:
            loading.agree(state, plans, None)  # so that no worker starts the step
        raise
    if agreeing:  # every worker has its part, padded as the whole batch is: or none starts the step
        parts = loading.agree(state, plans, [values[k] for k in loads])
        if parts is None:  # the worker that failed raises the loader's error in the controller
            raise StepSkipped(SKIPPED)
        for k, batch in zip(loads, parts):
            values[k] = batch
    # An unsplit call has no batch part to set: the one between calls is None already.
    batch_part = collectives.in_batch_part(part) if part is not None else nullcontext()
    # A step of a fn the module's RECORDABLE table names is recorded on a cuda device (runtime/recorded.py)
    recorder = recorded.recorder_for(state.device) if name in state.program.get("RECORDABLE", ()) else None
    if recorder is not None:  # a replayed step's update runs inside its graph, where no hook is called
        state.take_verdict()
    with batch_part:  # without autograd's graph: the worker's thread has it off (worker._serve)
        if recorder is not None:  # cuda graphs: no worker's code of its own runs in a replay
            result = recorder.call(name, fn, values, part)
        else:  # an error of this worker's alone: it joins the peers' collectives, and none updates
            with LEDGER.call(kind_of(name, values, part), state.device, state.take_verdict):
                result = fn(*values)
    if not answer:
        if state.device.type == "cuda":  # as the copy to the CPU would: the reply says the step's work is done
            torch.cuda.current_stream(state.device).synchronize()
        return None, None
    return to_cpu(result), [v.draws for v in values if isinstance(v, Mode)]


@handler("recording")
def recording(state: Any) -> dict[str, str]:
    """Whether each of the program's recordable fns is recorded on this worker, and why not
    (runtime/recorded.py): for `%shapescript status` and Program.recording(). {} on cpu."""
    program = getattr(state, "program", None)
    return recorded.program_report(program) if program is not None else {}


@handler("read")
def read(state: Any, handle: int, dotted: str) -> torch.Tensor:
    """A param or buffer of a model or of one of its sub-models, by its dotted name (`w1`,
    `blocks.0.attn.w_o`), whole: with the layout options, gathered from every worker's part."""
    model = state.objects[handle]
    return sharding.whole_of(model, dotted, model._leaf(dotted)).cpu()


@handler("state_dict")
def state_dict(state: Any, handle: int, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every param and buffer, whole; with `prefix` (`blocks.0.`), those of that sub-model alone,
    named within it. Every worker gathers the same leaves in the same order."""
    model = state.objects[handle]
    return {name.removeprefix(prefix): sharding.whole_of(model, name, model._leaf(name)).cpu()
            for name, _ in leaves(model.spec) if name.startswith(prefix)}


@handler("load_state")
def load_state(state: Any, handle: int, values: dict[str, torch.Tensor]) -> None:
    """`load_state_dict` of a model on the workers: `values`, every param and buffer whole, already
    checked against its spec by the controller; each worker copies in its own part of each."""
    model = state.objects[handle]
    with torch.no_grad():
        for name, _ in leaves(model.spec):
            model._leaf(name).copy_(sharding.this_part(model, name, values[name]))


@handler("optimizer_state")
def optimizer_state(state: Any, handle: int) -> dict[str, torch.Tensor]:
    """An optimizer's state by param and key, whole (with `shard params`, gathered from the pieces)."""
    opt = state.objects[handle]
    if sharding.sharding(opt.model) is not None:
        opt = sharded_state.whole_copy(opt.model, opt)[1]
    return opt.state_dict()


@handler("save")
def save(state: Any, path: str, model: int, opt: int | None, scheduler: dict[str, Any] | None = None) -> None:
    """Worker 0 writes the checkpoint one device would write; the others hold the same (with
    `shard params`, every worker sends its pieces to make it). `scheduler`: the entry of the torch
    scheduler driving the controller's optimizer (runtime/lr_schedulers.py), written as it is."""
    held, optimizer = state.objects[model], state.objects[opt] if opt is not None else None
    if sharding.sharding(held) is not None:
        sharded_state.save(path, held, optimizer, state.rank, scheduler)
    elif state.rank == 0:
        checkpoint.save_for(path, held, optimizer, scheduler)


@handler("restore")
def restore(state: Any, path: str, model: int, opt: int | None, scheduler: dict[str, Any] | None = None
            ) -> tuple[dict[str, Any], int, dict[str, Any] | None] | None:
    """Every worker loads the file (with `shard params`, keeping its pieces); the optimizer's
    settings and updates made, as restored, go back to the controller, and the file's scheduler
    entry, checked against `scheduler` (the form of the controller's) before anything changed."""
    held, optimizer = state.objects[model], state.objects[opt] if opt is not None else None
    if sharding.sharding(held) is not None:
        entry = sharded_state.load(path, held, optimizer, scheduler)
    else:
        entry = checkpoint.load_for(path, held, optimizer, scheduler)
    return (dict(optimizer.hyper), optimizer.steps, entry) if optimizer is not None else None


@handler("set_optimizer")
def set_optimizer(state: Any, handle: int, settings: dict[str, Any]) -> None:
    """`opt.set(...)` on every worker's optimizer (the controller checked the settings first)."""
    state.objects[handle].set(**settings)


@handler("optimizer_steps")
def optimizer_steps(state: Any, handle: int) -> int:
    return int(state.objects[handle].steps)


@handler("free")
def free(state: Any, handles: list[int]) -> None:
    gone = [state.objects.pop(h) for h in handles if h in state.objects]
    for key, loop in list(LOOPS.loops.items()):  # a loop over a freed dataset would keep it alive
        if any(loop.base is obj for obj in gone):
            LOOPS.loops.pop(key).close()


@handler("record_collectives")
def record_collectives(state: Any, on: bool) -> list[tuple[str, int, str, str]]:
    """Start recording every collective (on), or stop and return what was recorded: (.ss location,
    values, dtype, operation) each, to compare with the DeviceTable."""
    done = collectives.recorded or []
    collectives.recorded = [] if on else None
    return [(where, n, str(dtype).removeprefix("torch."), op) for where, n, dtype, op in done]


def describe(obj: Any) -> str:
    """"Mlp model", "AdamW[Mlp] optimizer", "dataset TensorDataset"."""
    if isinstance(obj, Model):
        return f"{obj.spec.name} model"
    if isinstance(obj, Optimizer):
        return f"{obj.kind}[{obj.model.spec.name}] optimizer"
    return f"dataset {type(obj).__name__}"


def own_bytes(obj: Any) -> int | None:
    """The bytes of the object's own tensors on this worker: a Model's params and buffers, an
    Optimizer's state (its model has a handle of its own), a TensorDataset's fields; None for any
    other dataset, whose items load one by one. Tensors sharing storage count it once."""
    if isinstance(obj, Model):
        tensors = [obj._leaf(name) for name, _ in leaves(obj.spec)]
    elif isinstance(obj, Optimizer):
        tensors = [t for per_param in obj.torch_opt.state.values() for t in per_param.values()
                   if isinstance(t, torch.Tensor)]
    elif isinstance(obj, TensorDataset):
        tensors = list(obj.fields.values())
    else:
        return None
    storages = {(t.device, t.untyped_storage().data_ptr()): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


@handler("objects")
def objects(state: Any) -> dict[str, Any]:
    """What this worker holds by handle, the bytes each one's tensors take (None: not known), and the
    bytes its device's tensors take (cuda only): for `%shapescript status` and anyone asking what
    lives on the workers."""
    held = sorted(state.objects.items())
    memory = torch.cuda.memory_allocated(state.device) if state.device.type == "cuda" else None
    return {"objects": {h: describe(o) for h, o in held}, "bytes": {h: own_bytes(o) for h, o in held},
            "device_memory": memory}
