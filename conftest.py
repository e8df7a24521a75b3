"""Session set-up shared by the tests and the notebooks run under nbval.

The example notebooks name the stock ``python3`` kernel (they load the extension
themselves) and the tests also use the ``rlm`` kernel: install both specs, pointing at
this interpreter, into a temporary prefix (never into the user's Jupyter directories)
and put that prefix on JUPYTER_PATH before nbval starts any kernel.

Two tiers: ``--fast`` leaves out the slow one (real kernels, terminals, the LiteLLM
Proxy, the notebooks and anything marked ``slow``) for day-to-day work; CI runs both.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Without this, importing litellm tries to download its price map (no network in CI).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# Executed copies of the notebooks (scripts/run_notebook.py writes them to build/; older
# versions wrote NAME.executed.ipynb beside the notebook) are outputs, not tests.
collect_ignore_glob = ["build/*", "notebooks/*.executed.ipynb", "notebooks/**/*.executed.ipynb"]

SLOW_MARKERS = ("kernel", "proxy", "slow")


def pytest_addoption(parser):
    parser.addoption(
        "--fast",
        action="store_true",
        help="leave out the slow tier: tests marked "
        + ", ".join(SLOW_MARKERS)
        + ", and the notebooks",
    )


# Tests that share a kernel, a terminal, the LiteLLM Proxy or one attack run (module- or
# session-scoped fixtures that take seconds to start) run on one pytest-xdist worker
# together, so each is started once; a notebook's cells run in order in one kernel.
# Everything else is spread one test at a time. (xdist's own `--dist loadgroup` relies
# on a node id attribute that pytest 9.2 no longer reads.)
SHARED_FIXTURE_MODULES = (
    "tests/test_real_kernel_specs_progress_and_interrupts.py",
    "tests/test_terminal_clients.py",
    "tests/test_proxy.py",
    "tests/test_sandbox_attacks.py",
)
ON_THEIR_OWN = (
    "tests/test_real_kernel_specs_progress_and_interrupts.py::test_example_notebook_",
)  # a kernel each


def worker_group(nodeid: str) -> str:
    """The unit of work a test belongs to: tests with the same group share a worker."""
    module = nodeid.split("::", 1)[0]
    if module.endswith(".ipynb"):
        return module
    if module in SHARED_FIXTURE_MODULES and not nodeid.startswith(ON_THEIR_OWN):
        return module
    return nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if not config.getoption("fast"):
        return
    kept, left_out = [], []
    for item in items:
        slow = item.path.suffix == ".ipynb" or any(
            item.get_closest_marker(name) for name in SLOW_MARKERS
        )
        (left_out if slow else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def pytest_configure(config):
    from ipykernel.kernelspec import install as install_python3

    from rlm_magic.jupyter.kernelspec import install

    prefix = Path(tempfile.mkdtemp(prefix="rlm-magic-kernels-"))
    install(prefix=str(prefix))
    install_python3(prefix=str(prefix))  # else nbval may find another Python's python3
    data_dir = str(prefix / "share" / "jupyter")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        p for p in (data_dir, os.environ.get("JUPYTER_PATH")) if p
    )
    config.rlm_kernel_prefix = prefix
    config.add_cleanup(lambda: shutil.rmtree(prefix, ignore_errors=True))
    if not hasattr(config, "workerinput"):  # once, before pytest-xdist's workers start
        _fetch_pyodide()


def _fetch_pyodide() -> None:
    """The wasm sandbox's Pyodide, fetched into its cache once (a fresh machine has
    none) before any test starts a wasm sandbox: not inside a test's time limit, and not
    by four workers at once. Without Deno the wasm tests skip and say why; a fetch that
    fails fails those tests with the error a user would see."""
    from rlm_magic.errors import SandboxError
    from rlm_magic.repl.backends import wasm

    deno = wasm.deno_binary()
    if deno is not None:
        try:
            wasm.fetch_pyodide(deno)
        except SandboxError:
            pass
