"""Calls out of the generated code: Python functions (`python fn`) and `print`."""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

from shapescript.errors import ShapeScriptError

_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {}


class PythonCallError(ShapeScriptError, RuntimeError):
    """A `python fn` couldn't be found, or raised."""


class ExternImportError(ShapeScriptError, ImportError):
    """An extern fn's module can't be imported by the workers, as the controller's own script."""


def resolve(module: str, attr: str, where: str) -> Callable[..., Any]:
    """The function `module.attr`, imported once and kept."""
    key = (module, attr)
    func = _FUNCTIONS.get(key)
    if func is None:
        try:
            func = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise PythonCallError(f"{where}: can't find the Python function `{module}.{attr}`: {e}") from None
        _FUNCTIONS[key] = func
    return func


def preload_externs(targets: list[tuple[str, str, str]]) -> None:
    """On a worker, import every extern fn's module as the program loads, not on the hot path. A
    worker never runs the controller's script, so a function of it can't be found there."""
    for module, attr, where in targets:
        if module == "__main__":
            raise ExternImportError(f"{where}: the extern fn `{module}.{attr}` is in the script the controller runs, "
                              f"which the workers never import; move it to a module of its own")
        resolve(module, attr, where)


def python_call(module: str, attr: str, args: tuple, check: Callable[[Any], Any] | None, where: str) -> Any:
    """Call `module.attr(*args)` and check its result against the declared type."""
    result = resolve(module, attr, where)(*args)
    return check(result) if check is not None else result


def show(*values: Any) -> None:
    """`print` of the language: tensors of one value print as numbers."""
    print(*(_plain(v) for v in values))


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.detach()
        return v.item() if v.numel() == 1 and v.dim() == 0 else v
    return v
