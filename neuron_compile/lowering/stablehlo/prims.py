"""TODO(helper): prims lowering rules."""

from __future__ import annotations
