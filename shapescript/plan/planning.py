"""What every plan pass reads and reports to (plan/passes.py runs them)."""

from __future__ import annotations

from ..check.context import Reporter
from ..check.program import Checked, FnInfo


class Planning(Reporter):
    """One program's planning: the checked program the passes read (with what the passes before
    found), and the diagnostics they report."""

    def __init__(self, checked: Checked) -> None:
        super().__init__()
        self.checked = checked

    @property
    def fns(self) -> dict[str, FnInfo]:
        return self.checked.fns
