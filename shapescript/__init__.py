"""ShapeScript: a statically shape-typed language for training models, compiled to PyTorch.

    import shapescript as ss
    prog = ss.load("mlp.ss")
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    prog.run(m, opt, dataset, ss.sinks.stdout())

The names below are imported when first used (PEP 562): `shapescript check` and `build`, the
language server and anything else that only reads programs never import torch (3 s).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shapescript.errors import (
    CompileError,
    DeviceError,
    Diagnostic,
    DomainError,
    ShapeError,
    ShapeScriptError,
    SourceWarning,
    WorkerError,
)

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from shapescript import parallel, schedules, sinks
    from shapescript.api import Program, cluster, load
    from shapescript.exporting import export
    from shapescript.parallel import collective_timeout
    from shapescript.pipeline import build
    from shapescript.runtime.checkpoint import load as restore
    from shapescript.runtime.checkpoint import save
    from shapescript.runtime.data import Batch, TensorDataset
    from shapescript.runtime.files import CsvDataset, ParquetDataset, TokenFile
    from shapescript.runtime.lr_schedulers import lr_scheduler
    from shapescript.runtime.model import Model
    from shapescript.runtime.modes import Eval, Mode, Train
    from shapescript.runtime.optim import Optimizer, adadelta, adagrad, adam, adamw, rmsprop, sgd
    from shapescript.weights import load_weights

# Each name imported on first use: (module, its name there)
_LATER = {
    "Program": ("shapescript.api", "Program"), "cluster": ("shapescript.api", "cluster"),
    "load": ("shapescript.api", "load"), "build": ("shapescript.pipeline", "build"),
    "collective_timeout": ("shapescript.parallel", "collective_timeout"),
    "restore": ("shapescript.runtime.checkpoint", "load"), "save": ("shapescript.runtime.checkpoint", "save"),
    "Batch": ("shapescript.runtime.data", "Batch"), "TensorDataset": ("shapescript.runtime.data", "TensorDataset"),
    **{name: ("shapescript.runtime.files", name) for name in ("CsvDataset", "ParquetDataset", "TokenFile")},
    "lr_scheduler": ("shapescript.runtime.lr_schedulers", "lr_scheduler"),
    "Model": ("shapescript.runtime.model", "Model"),
    "Eval": ("shapescript.runtime.modes", "Eval"), "Mode": ("shapescript.runtime.modes", "Mode"),
    "Train": ("shapescript.runtime.modes", "Train"),
    "Optimizer": ("shapescript.runtime.optim", "Optimizer"), "adamw": ("shapescript.runtime.optim", "adamw"),
    "load_weights": ("shapescript.weights", "load_weights"), "export": ("shapescript.exporting", "export"),
    **{maker: ("shapescript.runtime.optim", maker) for maker in ("adam", "adagrad", "adadelta", "rmsprop", "sgd")},
}


def __getattr__(name: str) -> Any:
    if name in _LATER:
        module, attribute = _LATER[name]
        value = getattr(importlib.import_module(module), attribute)
    elif not name.startswith("__"):  # a submodule, as `ss.sinks` or `ss.parallel`
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'shapescript' has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module 'shapescript' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = ["Batch", "CompileError", "CsvDataset", "DeviceError", "Diagnostic", "DomainError", "Eval", "Mode", "Model",
           "Optimizer", "ParquetDataset", "Program", "ShapeError", "ShapeScriptError", "SourceWarning", "TensorDataset",
           "TokenFile", "Train", "WorkerError",
           "adadelta", "adagrad", "adam", "adamw", "build", "cluster", "collective_timeout", "export", "load", "load_weights",
           "lr_scheduler", "parallel", "restore", "rmsprop", "save", "schedules", "sgd", "sinks"]


def load_ipython_extension(ip: InteractiveShell) -> None:  # `%load_ext shapescript`; IPython is imported only then
    from shapescript.notebook.magic import load_ipython_extension as load_magics
    load_magics(ip)
