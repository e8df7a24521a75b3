"""The worker's code as a sandbox that is not a process of this Python gets it: sent in
its first frame, never mounted or read from the package's folder inside.
"""

from __future__ import annotations

import functools
from pathlib import Path

from .. import bridge

_REPL = Path(__file__).parent.parent  # rlm_magic/repl: the worker's shared code


@functools.cache
def boot_frame(worker: Path, *extra: str) -> bytes:
    """The first frame: the REPL's shared modules (as ``rlm_magic/repl/NAME.py``; not
    the package's ``__init__``, which would import the rest), ``worker`` under its own
    name, and empty files at the ``extra`` paths. Read once per worker."""
    files = dict.fromkeys(extra, "")
    for path in sorted(_REPL.glob("*.py")):
        if path.name != "__init__.py":
            files[f"rlm_magic/repl/{path.name}"] = path.read_text("utf-8")
    files[worker.name] = worker.read_text("utf-8")
    return bridge.frame({"op": "boot", "files": files})
