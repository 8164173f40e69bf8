"""The names a model's members and a data type's fields may not take, and where a model keeps them.

From Python, a model (`Model`, or `RemoteModel` on several devices) and a batch (`Batch`,
`RemoteBatch`) show their members or fields as attributes, beside a few attributes of their own.
Those own attributes are listed here, once, for the checker to refuse them as names and for the
tests to hold every handle class to them; every other attribute a handle keeps starts with `_`,
and no member or field may. This module imports nothing, so a standalone build can inline it.
"""

from __future__ import annotations

# What Model and RemoteModel have themselves. `is_remote` tells a handle on several devices apart.
MODEL_RESERVED = frozenset({"init", "params", "named_params", "state_dict", "load_state_dict", "spec",
                            "is_remote"})
# What Batch and RemoteBatch have themselves.
DATA_RESERVED = frozenset({"spec", "size", "lengths", "is_remote"})

# A model keeps member `w` as the attribute `_m_w`, the live tensor that generated code reads;
# `model.w` from Python is a property of the model's class that gives a copy (runtime/model.py).
MEMBER_PREFIX = "_m_"


def is_reserved(name: str, reserved: frozenset[str]) -> bool:
    """Whether `name` would meet a handle's own attribute: one of `reserved`, or any `_` name."""
    return name in reserved or name.startswith("_")


def reserved_text(reserved: frozenset[str]) -> str:
    """The names for messages: `init`, `is_remote`, ..., and any name that starts with `_`."""
    return ", ".join(f"`{n}`" for n in sorted(reserved)) + ", and any name that starts with `_`"
