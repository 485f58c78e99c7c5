"""TODO(helper): hashing lowering rules."""

from __future__ import annotations
