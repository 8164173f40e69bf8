"""The names a model's members and a data type's fields may not take, and where a model keeps them.

From Python, a model (`Model`, or `RemoteModel` on several devices) and a batch (`Batch`,
`RemoteBatch`) show their members or fields as attributes, beside a few attributes of their own.
Those own attributes are listed here, once, for the checker to refuse them as names and for the
tests to hold every handle class to them; every other attribute a handle keeps starts with `_`,
and no member or field may. `similar` is the one "did you mean" for every name lookup, in the checker
and in the runtime's batch checks. This module imports only the standard library, so a standalone
build can inline it.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

# What Model and RemoteModel have themselves. `is_remote` tells a handle on several devices apart.
MODEL_RESERVED = frozenset({"init", "params", "named_params", "state_dict", "load_state_dict", "spec",
                            "is_remote"})
# What Batch and RemoteBatch have themselves.
DATA_RESERVED = frozenset({"spec", "size", "lengths", "is_remote"})

# The functions of shapescript/std.py, ShapeScript's own, that an `extern fn` may name in a program
# loaded with Python refused (`ss.load(..., python=False)`): they are part of the language, not code
# the program brings. tests/frontends/test_no_python.py holds this list to std.py's functions.
STD_EXTERNS = frozenset({"shapescript.std.layer_norm", "shapescript.std.rms_norm"})

# A model keeps member `w` as the attribute `_m_w`, the live tensor that generated code reads;
# `model.w` from Python is a property of the model's class that gives a copy (runtime/model.py).
MEMBER_PREFIX = "_m_"


def is_reserved(name: str, reserved: frozenset[str]) -> bool:
    """Whether `name` would meet a handle's own attribute: one of `reserved`, or any `_` name."""
    return name in reserved or name.startswith("_")


def reserved_text(reserved: frozenset[str]) -> str:
    """The names for messages: `init`, `is_remote`, ..., and any name that starts with `_`."""
    return ", ".join(f"`{n}`" for n in sorted(reserved)) + ", and any name that starts with `_`"


def similar(name: str, candidates: Iterable[str]) -> str:
    """'did you mean `X`?' for the candidate nearest `name`, by case first and then by spelling
    (edit distance); '' when none is near. The one helper every name lookup uses."""
    import difflib  # only when a name is wrong

    others = [c for c in dict.fromkeys(candidates) if c != name]
    same_case = [c for c in others if c.casefold() == name.casefold()]
    folded = {c.casefold(): c for c in reversed(others)}
    near = difflib.get_close_matches(name.casefold(), list(folded), n=1, cutoff=0.6)
    close = same_case or [folded[c] for c in near]
    return f"did you mean `{close[0]}`?" if close else ""


def spec_var(name: str) -> str:
    """The built module's variable holding a data or model type's spec. A declared type's name is an
    identifier; a generic model's use (`Linear[D C]`) is spelled with its name's letters and a hash
    of the whole, so no two names meet."""
    if name.isidentifier():
        return f"{name}_spec"
    readable = "_".join("".join(c if c.isalnum() else " " for c in name).split())
    return f"{readable}_{hashlib.sha256(name.encode()).hexdigest()[:10]}_spec"
