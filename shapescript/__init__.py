"""ShapeScript: a statically shape-typed language for training models, compiled to PyTorch.

    import shapescript as ss
    prog = ss.load("mlp.ss")
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    prog.run(m, opt, dataset, ss.sinks.stdout())
"""

from shapescript import parallel, sinks
from shapescript.api import Program, build, cluster, load
from shapescript.parallel import collective_timeout
from shapescript.errors import (CompileError, DeviceError, Diagnostic, DomainError, ShapeError, ShapeScriptError,
                                SourceWarning, WorkerError)
from shapescript.runtime.checkpoint import load as restore
from shapescript.runtime.checkpoint import save
from shapescript.runtime.data import Batch, TensorDataset
from shapescript.runtime.model import Model
from shapescript.runtime.modes import Eval, Mode, Train
from shapescript.runtime.optim import Optimizer, adamw, sgd

__all__ = ["Batch", "CompileError", "DeviceError", "Diagnostic", "DomainError", "Eval", "Mode", "Model", "Optimizer",
           "Program", "ShapeError", "ShapeScriptError", "SourceWarning", "TensorDataset", "Train", "WorkerError",
           "adamw", "build", "cluster", "collective_timeout", "load", "parallel", "restore", "save", "sgd", "sinks"]


def load_ipython_extension(ip: object) -> None:  # `%load_ext shapescript`; IPython is imported only then
    from shapescript.notebook.magic import load_ipython_extension as load_magics
    load_magics(ip)
