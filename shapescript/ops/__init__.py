"""The op table (table.py) and its entries, a module per family of operations."""

# Each family registers its ops; those of training steps, then the controller's, come last, in the
# order their rules always had ("did you mean" takes the first of equally near names).
from . import (  # noqa: F401
    controller,
    convolution,
    elementwise,
    indexing,
    library,
    loops,
    losses,
    norms,
    random_ops,
    reductions,
    selecting,
    shaping,
    sizes,
    steps,
    target_losses,
    training,
)
from .table import OPS, RULES, Across, CallView, LowerCall, Op, Payload, Typed, numel

__all__ = ["OPS", "RULES", "Across", "CallView", "LowerCall", "Op", "Payload", "Typed", "numel"]
