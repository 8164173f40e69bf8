"""What checking finds about the nodes of the tree, filled in as the bodies are checked: each
expression's type, each call's resolution and how to lower an expression. The tables are keyed by
the syntax node itself (the tree's nodes compare by identity); once checking is done they are
frozen into `Checked`, which only reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..shapes.options import Recipe
from ..shapes.value_types import Ty
from ..syntax import tree as A
from .program import CallInfo


@dataclass
class Tables:
    """The checker's tables while it fills them (the builder `Checked` is frozen from)."""
    types: dict[A.Node, Ty] = field(default_factory=dict)
    calls: dict[A.Node, CallInfo] = field(default_factory=dict)
    recipes: dict[A.Node, Recipe] = field(default_factory=dict)
