"""What the tests share, imported from here (``from .support import make_rlm``) or from
its modules (``from .support.kernels import Kernel``): the RLMs and notebook helpers a
test starts from, the way a cell is run, the reply shapes a scripted root model writes,
the local servers (``llm_server``, ``key_server``, ``foreign_servers``,
``litellm_proxy``), real kernels (``kernels``) and what several specifications share
(``hostile_text``, ``priced``, ``session_forger``, ``conversations``,
``resumable_maps``). Fixtures stay in ``conftest.py``; no test module imports another
test module, nor anything from ``conftest`` (``scripts/check_tests.py`` checks both)."""

from __future__ import annotations

from .measured import MEASURED
from .replies import last_feedback, outputs, repl, root_requests, sub_requests
from .rlms import ROOT, SUB, cell_result, helpers, make_rlm, run_cell, server_settings
from .waiting import eventually

__all__ = [
    "MEASURED",
    "ROOT",
    "SUB",
    "cell_result",
    "eventually",
    "helpers",
    "last_feedback",
    "make_rlm",
    "outputs",
    "repl",
    "root_requests",
    "run_cell",
    "server_settings",
    "sub_requests",
]
