"""The backends a test of the REPL's behaviour runs on: every one that can run here. A
backend that cannot (no Deno) is skipped with its reason, never silently dropped."""

from __future__ import annotations

import pytest

from rlm_magic.repl.backends import wasm

_WASM_MISSING = wasm.unavailable()

SANDBOXES = [
    "process",
    pytest.param(
        "wasm", marks=pytest.mark.skipif(_WASM_MISSING is not None, reason=str(_WASM_MISSING))
    ),
    "none",
]
# Where model code may start threads (WebAssembly has none: there they fail in one line,
# tests/test_wasm_sandbox.py).
THREADED_SANDBOXES = ["process", "none"]
