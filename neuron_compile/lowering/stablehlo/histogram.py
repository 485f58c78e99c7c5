"""TODO(helper): histogram lowering rules."""

from __future__ import annotations
