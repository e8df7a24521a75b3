"""Session set-up shared by the tests and the notebooks run under nbval.

The example notebooks name the stock ``python3`` kernel (they load the extension
themselves) and the tests also use the ``rlm`` kernel: install both specs, pointing at
this interpreter, into a temporary prefix (never into the user's Jupyter directories)
and put that prefix on JUPYTER_PATH before nbval starts any kernel.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Without this, importing litellm tries to download its price map (no network in CI).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def pytest_configure(config):
    from ipykernel.kernelspec import install as install_python3

    from rlm_magic.jupyter.kernelspec import install

    prefix = Path(tempfile.mkdtemp(prefix="rlm-magic-kernels-"))
    install(prefix=str(prefix))
    install_python3(prefix=str(prefix))  # else nbval may find another Python's python3
    data_dir = str(prefix / "share" / "jupyter")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        p for p in (data_dir, os.environ.get("JUPYTER_PATH")) if p)
    config.rlm_kernel_prefix = prefix
    config.add_cleanup(lambda: shutil.rmtree(prefix, ignore_errors=True))
