"""TODO(helper): segments decompositions."""

from __future__ import annotations

from typing import Any

DECOMPOSITIONS: dict[Any, Any] = {}
