"""The op table (table.py) and its entries, a module per family of operations."""

# Each family registers its ops; those of training steps, then the controller's, come last, in the
# order their rules always had ("did you mean" takes the first of equally near names).
from . import elementwise, indexing, library, losses, reductions, shaping, sizes, training  # noqa: F401
from . import steps  # noqa: F401,I001
from . import controller  # noqa: F401,I001
from .table import OPS, RULES, Across, CallView, LowerCall, Op, Payload, Typed, numel

__all__ = ["OPS", "RULES", "Across", "CallView", "LowerCall", "Op", "Payload", "Typed", "numel"]
