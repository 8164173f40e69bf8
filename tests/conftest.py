"""Shared test helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the tests run against this checkout
    sys.path.insert(0, str(ROOT))

UPDATE_GOLDEN = os.environ.get("SHAPESCRIPT_UPDATE_GOLDEN") == "1"
