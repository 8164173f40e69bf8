"""Paths and switches the tests share (imported as `support`, since each folder has its own conftest)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPDATE_GOLDEN = os.environ.get("SHAPESCRIPT_UPDATE_GOLDEN") == "1"
