"""Custom ops that passes introduce. Importing this package registers them with torch."""

from __future__ import annotations

from . import dot_general  # noqa: F401
