"""TODO(helper): runtime_asserts lowering rules."""

from __future__ import annotations
