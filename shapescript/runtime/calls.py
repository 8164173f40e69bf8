"""Calls out of the generated code: Python functions (`python fn`) and `print`."""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

from shapescript.errors import ShapeScriptError

_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {}


class PythonCallError(ShapeScriptError, RuntimeError):
    """A `python fn` couldn't be found, or raised."""


def python_call(module: str, attr: str, args: tuple, check: Callable[[Any], Any] | None, where: str) -> Any:
    """Call `module.attr(*args)` once, in the controller, and check its result against the declared type."""
    key = (module, attr)
    func = _FUNCTIONS.get(key)
    if func is None:
        try:
            func = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise PythonCallError(f"{where}: can't find the Python function `{module}.{attr}`: {e}") from None
        _FUNCTIONS[key] = func
    result = func(*args)
    return check(result) if check is not None else result


def show(*values: Any) -> None:
    """`print` of the language: tensors of one value print as numbers."""
    print(*(_plain(v) for v in values))


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.detach()
        return v.item() if v.numel() == 1 and v.dim() == 0 else v
    return v
