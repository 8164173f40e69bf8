"""The initializers a param or buffer can be declared with, each with its arguments and their
defaults: the checker reads which arguments exist, the runtime fills in those not given."""

from __future__ import annotations

INITS: dict[str, dict[str, float]] = {
    "normal": {"mean": 0.0, "std": 1.0},
    "uniform": {"low": 0.0, "high": 1.0},
    "zeros": {},
    "ones": {},
}
