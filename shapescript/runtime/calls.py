"""Calls out of the generated code: Python functions (`python fn`) and `print`."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from shapescript.errors import ShapeScriptError

_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {}


class PythonCallError(ShapeScriptError, RuntimeError):
    """A `python fn` couldn't be found, or raised."""


class ExternImportError(ShapeScriptError, ImportError):
    """An extern fn's module can't be imported by the workers: the controller's own script, or a
    module a worker on a cluster doesn't have."""


# Set on a worker by `preload_externs`: the file of the script the controller runs (None if it runs
# none), which no worker imports.
on_worker = False
controller_script: str | None = None
# Set on a worker on a cluster (parallel/ray_workers.py): given a module that worker can't import,
# where it is and how to ship the module there.
missing_module_help: Callable[[str], str] | None = None


def main_script() -> str | None:
    """The file of the script the controller runs (None in a notebook, a REPL or `python -c`); on
    a worker, the controller's."""
    if on_worker:
        return controller_script
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return os.path.realpath(path) if path else None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _in_main_script(module: str) -> bool:
    """Whether `module` is the controller's own script, by `__main__` or by its module name (as
    `train` from `python train.py`). Files are compared, not names: each dotted prefix is looked up,
    without running it, before the next is imported."""
    if module.split(".")[0] == "__main__":
        return True
    script = main_script()
    if script is None:
        return False
    parts = module.split(".")
    for k in range(1, len(parts) + 1):
        name = ".".join(parts[:k])
        loaded = sys.modules.get(name)
        try:
            origin = getattr(loaded, "__file__", None) if loaded is not None else \
                getattr(importlib.util.find_spec(name), "origin", None)
        except (ImportError, ValueError):
            return False  # import_module raises the proper error
        if origin and _same_file(origin, script):
            return True
    return False


def _import(module: str, attr: str, where: str) -> Any:
    """The module an extern or python fn names. The controller's own script is never imported a
    second time: in the controller it is `__main__`, already running; on a worker it is an error."""
    if not _in_main_script(module):
        return importlib.import_module(module)
    if on_worker:
        raise ExternImportError(
            f"{where}: the extern fn `{module}.{attr}` is in the script the controller runs "
            f"({controller_script or '__main__'}), which the workers never import, since its top level must "
            f"run once; move the function to a module of its own and name that module")
    return sys.modules["__main__"]


def resolve(module: str, attr: str, where: str) -> Callable[..., Any]:
    """The function `module.attr`, imported once and kept."""
    key = (module, attr)
    func = _FUNCTIONS.get(key)
    if func is None:
        try:
            func = getattr(_import(module, attr, where), attr)
        except ExternImportError:
            raise
        except (ImportError, AttributeError) as e:
            if isinstance(e, ModuleNotFoundError) and on_worker and missing_module_help is not None:
                raise ExternImportError(f"{where}: can't import the function `{module}.{attr}`: "
                                        f"{missing_module_help(e.name or module)} ({e})") from None
            raise PythonCallError(f"{where}: can't find the Python function `{module}.{attr}`: {e}") from None
        _FUNCTIONS[key] = func
    return func


def preload_externs(targets: list[tuple[str, str, str]], script: str | None) -> None:
    """On a worker, import every extern fn's module as the program loads, not on the hot path.
    `script` is the controller's main script, which a worker never imports."""
    global on_worker, controller_script
    on_worker, controller_script = True, script
    for module, attr, where in targets:
        resolve(module, attr, where)


def python_call(module: str, attr: str, args: tuple, check: Callable[[Any, tuple], Any] | None, where: str) -> Any:
    """Call `module.attr(*args)` and check its result against the declared type: `check` is a
    ResultGuard (runtime/guards.py) that the built module prints, so the check runs on every target;
    it binds the generic dims from `args` before it checks the result."""
    result = resolve(module, attr, where)(*args)
    return check(result, args) if check is not None else result


def show(*values: Any) -> None:
    """`print` of the language: tensors of one value print as numbers."""
    print(*(_shown(v) for v in values))


def _shown(v: Any) -> Any:  # not `_plain`: sinks.py has one, and a standalone build inlines both
    if isinstance(v, torch.Tensor):
        v = v.detach()
        return v.item() if v.numel() == 1 and v.dim() == 0 else v
    return v
