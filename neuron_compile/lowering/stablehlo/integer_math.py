"""TODO(helper): integer_math lowering rules."""

from __future__ import annotations
