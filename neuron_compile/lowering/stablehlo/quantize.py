"""TODO(helper): quantize lowering rules."""

from __future__ import annotations
