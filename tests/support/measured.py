"""Figures the real-kernel tests measure (interrupt-to-reply seconds, widget messages),
reported once at the end of the run: they are observations, not checks."""

from __future__ import annotations

MEASURED: dict[str, float | int] = {}
