"""The Python API: `load` a program, then use its models, data types and functions as attributes."""

from __future__ import annotations

import inspect
import itertools
import linecache
import os
import sys
import threading
import traceback
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .background import BackgroundRun, stop_runs_of
from .check.program import Checked, FnInfo
from .devices import DeviceSet
from .errors import ClusterNeededError, ShapeScriptError, Span
from .lower.printer import py_name
from .lower.targets import WORKERS_NAME, Target
from .lower.text import comment_text
from .names import spec_var
from .ops.checking import Use
from .parallel import pipeline
from .parallel.interrupts import preparing_a_call
from .parallel.remote import RemoteFunction
from .pipeline import build, compile_program, parse_devices, python_modules, read_program, short_repr
from .plan.comms import device_table
from .runtime import calls, loops, recorded, sinks, steps
from .runtime.guards import signature_check
from .runtime.model import Model, require_visible
from .shapes import value_types as T
from .shapes.kinds import FnKind
from .shapes.plans import Where
from .stale import current_models
from .syntax import tree as A


def load(path_or_source: str | os.PathLike[str], devices: str | None = None, dims: dict[str, int] | None = None,
         name: str | None = None, check_types: bool = False, *, python: bool = True,
         compiled: bool | str = False) -> Program:
    """Check and build a program. `devices` overrides its devices line; `dims` sets declared dims' sizes;
    `check_types` builds a debug module that checks every value against its checked type as it runs;
    `compiled` hands each pure function on the devices to torch.compile (True: inductor; or a backend's
    name), on one device (runtime/compiled.py).

    A program is code: its `python fn` and `extern fn` import and call any Python function they name
    when called. `python=False` refuses a program that names any (a CompileError, E0701, at each
    declaration), but for the standard library's (`shapescript.std`)."""
    source, file = read_program(path_or_source, name)
    return Program(compile_program(source, file, devices, dims, python), check_types, compiled=compiled)


_PROGRAM_NUMBERS = itertools.count(1)


class Program:
    """A loaded program: `prog.Mlp.init(seed=0)`, `prog.train_step(m, opt, batch)`, `prog.Digit`."""

    def __init__(self, checked: Checked, check_types: bool = False, fused: bool = True,
                 compiled: bool | str = False) -> None:
        """`fused=False` builds the program as written, without ir/fuse.py's kernels (to compare)."""
        self.checked = checked
        self._pool: Any = None
        self._workers_lock, self._lock_pid = threading.RLock(), os.getpid()  # see _pool_lock
        # The modules are exactly what runs: on several devices this process runs the controller's,
        # whose fns on the devices are stubs calling the workers, and each worker loads the worker's.
        several = checked.device_set.count > 1
        targets = (Target.CONTROLLER, Target.WORKER) if several else (Target.ONE_DEVICE,)
        sources = python_modules(checked, targets, check_types=check_types, fused=fused)
        self.python_source = sources[0]
        self.worker_source: str | None = sources[1] if several else None
        self._module_file = f"<shapescript {comment_text(checked.file)}>"  # no NUL or line break from a name
        linecache.cache[self._module_file] = (len(self.python_source), None,
                                              self.python_source.splitlines(True), self._module_file)
        # A module of its own in sys.modules, where torch.compile's tracer looks a function's globals up
        module = types.ModuleType(f"shapescript_program_{next(_PROGRAM_NUMBERS)}")
        namespace: dict[str, Any] = module.__dict__
        exec(compile(self.python_source, self._module_file, "exec"), namespace)  # our generated code
        sys.modules[module.__name__] = module
        weakref.finalize(self, sys.modules.pop, module.__name__, None)
        self.namespace = namespace  # python and extern fns' results are checked by the module itself
        self._members: dict[str, Any] = {}
        self.device = torch.device(namespace["DEVICE"])
        self.compiled = self._compile(compiled) if compiled else {}
        for name, model in checked.models.items():
            if model.of is None:
                self._members[name] = ModelType(self, namespace[spec_var(name)])
        for item in checked.program.items:
            if isinstance(item, A.Model) and item.params and item.name not in self._members:
                self._members[item.name] = GenericModelType(self, item.name, tuple(p.name for p in item.params))
        for name in checked.data:
            self._members[name] = namespace[spec_var(name)]
        if several:
            from .parallel.loading import Datasets
            self.datasets = Datasets()  # what the workers hold of the datasets this program's loops read
            namespace[WORKERS_NAME] = self  # the controller's module reaches its workers through this program
            from .parallel import cluster as clusters
            if not checked.device_set.several_hosts and clusters.current() is None:
                from .parallel import forkserver
                forkserver.fork_ahead(os.environ, os.getcwd())  # before the script's data starts torch's threads
        for name, fn in checked.fns.items():
            self._members[name] = Function(self, fn)

    def _compile(self, backend: bool | str) -> dict[str, Any]:
        if self.checked.device_set.count > 1:
            raise ValueError("compiled=: compiled steps run on one device so far; load the program on one")
        from .runtime.compiled import compile_functions  # torch._dynamo: only where it's used
        pure = {name: py_name(name) for name, fn in self.checked.fns.items()
                if fn.kind == FnKind.FN and not any(p.mut for p in fn.params)
                and self.checked.placement(name).where != Where.CONTROLLER and not self.checked.reaches_extern(name)}
        return compile_functions(self.namespace, pure, "inductor" if backend is True else str(backend))

    def compile_report(self) -> dict[str, float | None]:
        """Each compiled function's first call in seconds (compiling it, and one run; None until called)."""
        return {name: f.compile_seconds for name, f in self.compiled.items()}

    @property
    def names(self) -> list[str]:
        """What the program defines, as its attributes: models (a generic one as `prog.Linear`, whose
        uses are `prog.Linear["D", "C"]`), data types and functions."""
        return list(self._members)

    @property
    def several(self) -> bool:
        return self.checked.device_set.count > 1

    def workers(self, background: bool = False) -> Any:
        """The worker pool of a program on several devices, started when first needed. With
        `background`, this returns at once and the pool's next call waits for the workers. Threads
        that ask at once share one pool."""
        with self._pool_lock():
            if self._pool is None or not self._pool.alive:
                devices = self.checked.device_set
                from .parallel import cluster as clusters
                on = clusters.current()  # with a cluster, any devices line's workers run there
                if devices.several_hosts and on is None:  # the local pool is one host's; a cluster places the others
                    raise ClusterNeededError.of(str(devices), devices.hosts, devices.count)
                from .parallel.pool import WorkerPool
                launcher = None
                if on is not None:
                    from .parallel.ray_workers import RayLauncher
                    launcher = RayLauncher(on)
                pool = WorkerPool(self.checked.device_set, modules=["shapescript.parallel.program_handlers"],
                                  launcher=launcher)
                try:
                    if background:
                        pool.first("load_program", self._load_args(), where="loading the program")
                        pool.start_background()
                    else:
                        pool.start()
                        pool.call("load_program", self._load_args(), where="loading the program")
                except BaseException:
                    pool.stop()  # no one else holds it
                    raise
                self._pool = pool
            return self._pool

    def _pool_lock(self) -> threading.RLock:
        """Held while the pool is started, adopted or stopped. A forked child makes its own: a thread
        of the parent may have held this one at the fork, and would never release it there."""
        if self._lock_pid != os.getpid():
            self._workers_lock, self._lock_pid = threading.RLock(), os.getpid()
        return self._workers_lock

    @property
    def pool(self) -> Any:
        """The running (or starting) worker pool, or None."""
        return self._pool if self._pool is not None and self._pool.alive else None

    @property
    def last_pool(self) -> Any:
        """The pool this program used last, running or not (one that failed says how its workers
        ended); None before the first, and after `stop()`."""
        return self._pool

    def adopt_workers(self, old: Program, keep_datasets: bool = False) -> bool:
        """Take over `old`'s running workers if both programs run on the same devices: they load
        this program's code with their next call, and keep the models and optimizer state they
        hold, so `old`'s handles stay valid. `keep_datasets`: the data types are unchanged, so the
        datasets the workers keep may be used as they are. False if there was nothing to adopt."""
        pool = old.pool
        if pool is None or not self.several or not pool.devices.same_workers(self.checked.device_set):
            return False
        with self._pool_lock():
            pool.first("load_program", self._load_args(), where="loading the program")
            self._pool = pool
            if keep_datasets:
                self.datasets = old.datasets
        return True

    def _load_args(self) -> tuple[str, str, str, str | None, int]:
        """The `load_program` handler's arguments. The program's seed, from which each worker seeds
        the random states its extern fns draw from, is torch's seed here as the workers load it."""
        assert self.worker_source is not None  # only a program on several devices has workers
        return (self.worker_source, self._module_file, str(self.checked.device_set), calls.main_script(),
                torch.initial_seed())

    def stop(self) -> None:
        """Stop the workers (on several devices); models on them are gone. A call in progress in
        another thread finishes first, and a run in the background stops at its next step boundary."""
        stop_runs_of(self)
        with self._pool_lock():
            if self._pool is not None:
                self._pool.stop()
                self._pool = None

    def memory(self) -> list[Any]:
        """Each worker's memory as measured there (parallel/memory.py's WorkerMemory), in rank order:
        now, the last call's peak, params and optimizer state. [] on one device, and while no workers
        run (asking starts none)."""
        if not self.several or self._pool is None or not self._pool.alive:
            return []
        from .parallel.memory import ask
        return ask(self._pool, "measuring memory")

    def recording(self) -> dict[str, str]:
        """Whether each fn a cuda device may record as a CUDA graph (runtime/recorded.py) is recorded,
        by name: "recorded (replays 120)", "not recorded: <why>", "warming up (2 of 3 calls)", "not
        called yet". {} on cpu. On several devices, worker 0's (the workers record together), and {}
        while no workers run (asking starts none)."""
        if not self.several:
            return recorded.program_report(self.namespace)
        if self.devices.kind != "cuda" or self._pool is None or not self._pool.alive:
            return {}
        answers: list[dict[str, str]] = self._pool.call("recording", (), where="asking what is recorded")
        return answers[0] if answers else {}

    def timeline(self, last: int | None = None) -> Any:
        """Where each worker's time went in the last `last` calls on the workers (all those kept, up to
        500, by default): a parallel/timeline.py TimelineTable (print it, or read `.rows`). Asks the
        workers nothing; on one device it says there are none."""
        from .parallel.timeline import table_of
        pool = self._pool
        return table_of(pool.timeline if pool is not None else None, str(self.devices), self.several, last)

    def __getattr__(self, name: str) -> Any:
        members = self.__dict__.get("_members", {})
        if name in members:
            return members[name]
        raise AttributeError(f"the program {self.checked.file} has no `{name}`; it defines "
                             f"{', '.join(members) or 'nothing'}")

    def __dir__(self) -> list[str]:
        return list(super().__dir__()) + list(self._members)

    def __repr__(self) -> str:
        return f"<ShapeScript program {self.checked.file} on {self.checked.device_set}: {', '.join(self._members)}>"

    @property
    def devices(self) -> DeviceSet:
        return self.checked.device_set

    @property
    def device_table(self) -> Any:
        """How values lie on the devices and what each line sends (plan/comms.py's DeviceTable)."""
        return device_table(self.checked)

    def locate(self, exc: BaseException) -> list[tuple[str, Span]]:
        """The (function, .ss location) of each generated frame in an exception's traceback, outermost first."""
        lines = self.namespace["SS_LINES"]
        found = []
        for frame in traceback.extract_tb(exc.__traceback__):
            if frame.filename == self._module_file and frame.lineno in lines:
                line, col = lines[frame.lineno]
                found.append((frame.name, Span(self.checked.file, line, col, line, col + 1)))
        return found


class ModelType:
    """A model type of a program: `prog.Mlp.init(seed=0)`."""

    def __init__(self, program: Program, spec: Any) -> None:
        self.program = program
        self.spec = spec

    def init(self, seed: int) -> Any:
        """The model drawn from `seed` (on the CPU, so every device gets the same), on the program's device;
        on several devices a RemoteModel, the same on every worker."""
        if self.program.several:
            from .parallel.remote import RemoteModel
            return RemoteModel.init(self.program, self.spec, seed)
        return Model.init(self.spec, seed, self.program.device)

    def __repr__(self) -> str:
        return f"<model type {self.spec.name} ({self.spec.where})>"


@torch.compiler.disable
def _checked_eagerly(fn: Function, args: tuple, kwargs: dict) -> list[Any]:
    return fn._checked_args(args, kwargs)


@torch.compiler.disable
def _eagerly(fn: Function, args: tuple, kwargs: dict) -> Any:
    return fn(*args, **kwargs)


class GenericModelType:
    """A generic model of a program: `prog.Linear["D", "C"]` is its use `Linear[D C]` in the program,
    a ModelType (each dim as the program writes it: a name, a number, `3*Dh*H` as errors show it)."""

    def __init__(self, program: Program, name: str, params: tuple[str, ...]) -> None:
        self.program = program
        self.name = name
        self.params = params

    def uses(self) -> list[str]:
        """Its uses in the program, as `Linear[D C]`."""
        return [n for n, m in self.program.checked.models.items() if m.of is not None and m.family == self.name]

    def __getitem__(self, dims: Any) -> ModelType:
        given = dims if isinstance(dims, tuple) else (dims,)
        if not all(isinstance(d, (str, int)) and not isinstance(d, bool) for d in given):
            raise TypeError(f"`{self.name}[...]` takes dims as the program writes them, names or numbers, "
                            f"not {short_repr(dims)}")
        key = f"{self.name}[{' '.join(str(d) for d in given)}]"
        if key not in self.program.checked.models:
            uses = self.uses()
            shown = key if len(key) <= 200 else short_repr(key)
            raise KeyError(f"the program has no `{shown}`: it uses {', '.join(uses)}" if uses else
                           f"the program uses `{self.name}` at no size; give it its dims in a type, as "
                           f"`{self.name}[{' '.join(self.params)}]`")
        return ModelType(self.program, self.program.namespace[spec_var(key)])

    def __repr__(self) -> str:
        return f"<generic model type {self.name}[{' '.join(self.params)}]: {', '.join(self.uses()) or 'not used'}>"


class Function:
    """A function of a program, called from Python with tensors, batches as dicts, models, datasets."""

    def __init__(self, program: Program, fn: FnInfo) -> None:
        self.program = program
        self.info = fn
        self.name = fn.name
        self._py = program.namespace[py_name(fn.name)]
        self._guards: tuple[Any, ...] | None = None  # read at the first call
        # The guards' short way (runtime/guards.py's signature_check), made with them; None where none
        self._quick: Callable[[Sequence[Any]], list[Any] | None] | None = None
        self._names = [p.name for p in fn.params]
        self._on_workers = isinstance(self._py, RemoteFunction)  # placed on the devices, called in the workers
        # What `help(prog.f)`, `prog.f?` and editors show: the .ss signature, not (*args, **kwargs)
        self.__signature__, self._header = _signature_of(fn, with_background="background" not in self._names)
        self.__doc__ = (f"{self._header}\n\nAt {program.checked.file}, line {fn.span.line}. Its arguments: tensors, batches "
                        f"as dicts, models, datasets; `background=True` runs it in a thread of its own.")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call it; with `background=True` (unless the fn has a parameter of that name: then use
        `start`), start it in a thread of its own and return a BackgroundRun (shapescript/background.py)."""
        if torch.compiler.is_compiling():
            return self._traced(args, kwargs)
        if "background" in kwargs and "background" not in self._names:
            background = kwargs.pop("background")
            if not isinstance(background, bool):
                raise TypeError(f"background is True or False, not {type(background).__name__} {short_repr(background)}")
            if background:
                return self.start(*args, **kwargs)
        if not self._on_workers:
            checked = self._checked_args(args, kwargs)
            with steps.between_steps():  # while a background run goes, between two of its steps
                return self._invoke(checked)
        # A call on the workers is one step from the start: Ctrl-C while its arguments are checked
        # waits for the step too (parallel/interrupts.py).
        with preparing_a_call(f"`{self.name}`", self.program.checked.device_set):
            checked = self._checked_args(args, kwargs)
            with steps.between_steps():
                return self._invoke(checked)

    def _traced(self, args: tuple, kwargs: dict) -> Any:
        """The call as `torch.compile(prog.f)` traces it: the arguments' checks run eagerly (the one
        graph break, before any op), then the function's body, which the tracer follows into the built
        module. On several devices the call goes to the workers, eagerly."""
        if self._on_workers or self.program.several:
            return _eagerly(self, args, kwargs)
        checked = _checked_eagerly(self, args, kwargs)
        with torch.no_grad():  # as a call from Python runs it: gradients only where value_and_grad takes them
            return self._py(*checked)

    def start(self, *args: Any, **kwargs: Any) -> BackgroundRun:
        """Start the call in a thread of its own and return at once with its BackgroundRun: `.wait()`,
        `.stop()` (at the next step boundary), `.progress()`. Its arguments are checked here first."""
        checked = self._checked_args(args, kwargs)
        return BackgroundRun(self.name, self.program, lambda: self._invoke(checked))

    def _checked_args(self, args: tuple, kwargs: dict) -> list[Any]:
        values = self._arrange(args, kwargs)
        if self._guards is None:
            devices = self.program.checked.device_set
            # At the first call, not at load: a program can be read anywhere. Several hosts' devices
            # are a cluster's, not this machine's. A function that never touches the devices (one in
            # the controller that counts and prints) runs without them: see needs_devices.
            if (devices.kind == "cuda" and not devices.several_hosts
                    and (self._on_workers or needs_devices(self.program.checked, self.name))):
                require_visible(devices.indices or (0,), str(devices), f"`{self.name}`")
            # printed by the built module; a model argument is also checked against this program's shapes
            printed = self.program.namespace["GUARDS"][self.name]
            self._guards = current_models(self.program, printed)
            specs = {name: self.program.namespace[spec_var(name)] for name in self.program.checked.models}
            self._quick = signature_check(printed, specs)
        quick = self._quick
        if quick is not None:
            checked = quick(values)
            if checked is not None:
                return checked
        bindings: dict = {}
        return [g(v, bindings) for g, v in zip(self._guards, values)]

    def _invoke(self, checked: list[Any]) -> Any:
        grad_was = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # as torch.no_grad(), at a third of its cost; value_and_grad
        scope = loops.call_scope  # the notebook's: one progress bar per loop for the whole call
        try:  # turns gradients on where it needs them
            if scope is None:
                return self._run(checked)
            with scope:
                return self._run(checked)
        except ShapeScriptError:
            raise
        except Exception as e:
            for fn_name, span in self.program.locate(e):
                e.add_note(f"in `{fn_name}` at {span}: {_source_line(self.program.checked, span)}")
            raise
        finally:
            torch._C._set_grad_enabled(grad_was)

    def _run(self, checked: list[Any]) -> Any:
        if self._on_workers or not self.program.several:
            # one cuda device: a fn in the module's RECORDABLE table is recorded (runtime/recorded.py)
            recorder = recorded.for_program(self.program.namespace, self._py)
            try:
                return self._py(*checked) if recorder is None else recorder.call(self._py.__name__, self._py, checked)
            finally:  # every record a GPU's values held back is written before the call returns or raises
                sinks.send_held()
        # A controller's fn: its loops may send steps without waiting for their answers.
        with pipeline.settled(lambda: self.program.pool, f"`{self.name}`", self.program.checked.device_set):
            return self._py(*checked)

    def _arrange(self, args: tuple, kwargs: dict) -> list[Any] | tuple:
        names = self._names
        if not kwargs and len(args) == len(names):
            return args  # every argument by position: nothing to arrange
        if len(args) > len(names):
            raise TypeError(f"`{self.name}` takes {len(names)} arguments ({', '.join(names)}), given {len(args)}")
        values = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"`{self.name}` has no parameter `{k}`; its parameters: {', '.join(names)}")
            if k in values:
                raise TypeError(f"`{self.name}` got `{k}` twice")
            values[k] = v
        missing = [n for n in names if n not in values]
        if missing:
            raise TypeError(f"`{self.name}` is missing {', '.join(missing)}")
        return [values[n] for n in names]

    def __repr__(self) -> str:
        return f"<{self._header} at {self.info.span}, runs {self.program.checked.placement(self.name).where}>"


class _TypeText:
    """A parameter's .ss type as a signature shows it: `batch: [b] Digit`, not a quoted string."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _signature_of(fn: FnInfo, with_background: bool) -> tuple[inspect.Signature, str]:
    """A fn's Python signature, each parameter annotated with its checked type (`mut` with it), and
    its header as in .ss: `fn train_step(mut m: Mlp, batch: [b] Digit) -> []`."""
    types = [p.ty.show() for p in fn.params]
    returns = fn.ret.show()
    params = [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=_TypeText(("mut " if p.mut else "") + t)) for p, t in zip(fn.params, types)]
    if with_background:
        params.append(inspect.Parameter("background", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=bool))
    nothing = returns == "nothing"
    signature = inspect.Signature(params, return_annotation=inspect.Signature.empty if nothing else _TypeText(returns))
    written = ", ".join(("mut " if p.mut else "") + f"{p.name}: {t}" for p, t in zip(fn.params, types))
    kind = {"extern": "extern fn", "python": "python fn"}.get(fn.kind, "fn")
    return signature, f"{kind} {fn.name}({written})" + ("" if nothing else f" -> {returns}")


# What a one-device program's function does that touches its device: tensors (its own, or its
# parameters'), a loop over a dataset (the batches go to the device), a checkpoint saved or loaded.
_DEVICE_USES = (Use.TENSORS, Use.LOOP, Use.DATASET, Use.SAVE, Use.LOAD)


def _device_values(t: T.Ty) -> bool:
    """Whether a value of type `t` lives on the devices (or, a dataset, sends its batches there)."""
    if isinstance(t, T.TupleT):
        return any(_device_values(item) for item in t.items)
    return isinstance(t, (T.TensorT, T.BatchT, T.ModelT, T.StackT, T.OptT, T.GradT, T.DatasetT, T.BatchesT))


def needs_devices(checked: Checked, name: str) -> bool:
    """Whether a call of `name` needs the program's devices from its start, so that its first call
    checks that they are there. A function that runs on them does. On several devices nothing else
    does: a function in the controller reaches the devices only through the workers, whose pool
    checks them as it starts, when (and only if) the function first calls one on the workers or
    loads a batch for them. On one device a function in the controller runs in this process, on the
    device's tensors: it needs the device unless neither it nor a function it calls, however deeply,
    runs there, does device work, has a tensor, batch, model, optimizer, gradient or dataset among
    its parameters, its result or its body's values, or saves or loads a checkpoint. So a function
    that only loops over a range, prints numbers or writes them to a sink never needs them."""
    if checked.placement(name).where == Where.WORKERS:
        return True
    if checked.device_set.count > 1:
        return False
    seen: set[str] = set()
    todo = [name]
    while todo:
        fn = todo.pop()
        info = checked.fns.get(fn)
        if info is None or fn in seen:
            continue
        seen.add(fn)
        if (checked.placement(fn).where == Where.WORKERS or info.device_work
                or any(use in info.uses for use in _DEVICE_USES)
                or any(_device_values(p.ty) for p in info.params) or _device_values(info.ret)):
            return True
        todo.extend(info.calls)
    return False


def _source_line(checked: Checked, span: Span) -> str:
    lines = checked.source.splitlines()
    return lines[span.line - 1].strip() if 0 < span.line <= len(lines) else ""


def cluster(address: object, runtime_env: dict[str, Any] | None = None) -> Any:
    """Run programs' workers on a Ray cluster from now on (docs/cluster.md): `"auto"` ($RAY_ADDRESS,
    or a cluster running on this machine), `"ray://head:10001"`, or an object with an `.address`
    (ray.cluster_utils.Cluster). Any devices line then runs there, `2 x cuda[0 1]` as well as
    `cuda[0 1]`; pools already running stay where they are. `runtime_env` is Ray's, for this
    process's connection: `{"py_modules": ["my_externs.py"]}` ships modules the hosts can't import
    (extern fns') to every worker; it is a ValueError once Ray was connected by a `ray.init` of
    one's own. `None`: stop the workers on the cluster and go back to this machine's. Needs
    `pip install 'shapescript[ray]'`."""
    from .parallel import cluster as clusters
    if address is None:
        if runtime_env is not None:
            raise ValueError("runtime_env is for connecting to a cluster, not for ss.cluster(None)")
        clusters.disconnect()
        return None
    return clusters.connect(address, runtime_env=runtime_env)


__all__ = ["Function", "GenericModelType", "ModelType", "Program", "build", "cluster", "load", "parse_devices"]
