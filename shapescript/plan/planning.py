"""What every plan pass reads and reports to (plan/passes.py runs them)."""

from __future__ import annotations

from ..check.context import Reporter
from ..ir import nodes as N


class Planning(Reporter):
    """One program's planning: its IR as the passes so far have left it, and the diagnostics they
    report."""

    def __init__(self, module: N.Module) -> None:
        super().__init__()
        self.module = module

    @property
    def fns(self) -> dict[str, N.Function]:
        return {f.name: f for f in self.module.functions}
