"""The report: which isolation layers are in force, and why any is not.

The worker fills it in as it applies the layers and sends it to the kernel before any
model code runs; the kernel reads it into ``result.isolation``.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

LAYERS = ("user", "pid", "filesystem", "network", "syscalls", "processes", "memory")
# Layers that together make "full isolation" (RLM.sandbox_require_isolation). The
# memory cap is per process (no cgroup is used), so it is reported, not required.
REQUIRED_LAYERS = ("user", "pid", "filesystem", "network", "syscalls", "processes")


@dataclass
class Report:
    """Which layers are in force, and why any is not (one short reason each)."""

    layers: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(LAYERS, False))
    notes: dict[str, str] = field(default_factory=dict)

    def refused(self, layer: str, why: str) -> None:
        self.layers[layer] = False
        self.notes.setdefault(layer, why)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
