"""The op table (table.py) and its entries, a module per family of operations."""

from . import elementwise, indexing, library, losses, reductions, shaping, sizes, training  # noqa: F401  (each registers its ops)
from .table import OPS, Across, CallView, LowerCall, Op, Payload, Typed, numel

__all__ = ["OPS", "Across", "CallView", "LowerCall", "Op", "Payload", "Typed", "numel"]
