"""What the tests share, imported from here (``from .support import make_rlm``): the
RLMs and notebook helpers a test starts from, the way a cell is run, the reply shapes
a scripted root model writes. Fixtures stay in ``conftest.py``; no test module imports
another test module."""

from __future__ import annotations

from .measured import MEASURED
from .replies import last_feedback, repl, root_requests, sub_requests
from .rlms import ROOT, SUB, cell_result, helpers, make_rlm, run_cell, server_settings

__all__ = [
    "MEASURED",
    "ROOT",
    "SUB",
    "cell_result",
    "helpers",
    "last_feedback",
    "make_rlm",
    "repl",
    "root_requests",
    "run_cell",
    "server_settings",
    "sub_requests",
]
