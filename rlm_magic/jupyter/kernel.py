"""The "Python 3 (RLM)" kernel: the stock IPython kernel with rlm_magic preloaded.

A notebook using this kernel has ``llm_query``, ``llm_query_batch``, ``rlm_query``,
``%%rlm`` ... from its first cell, with no ``%load_ext rlm_magic``. Install the kernel
spec with ``python -m rlm_magic.jupyter.kernelspec install``; Jupyter then starts it as
``python -m rlm_magic.jupyter.kernel -f {connection_file}``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__" and sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
    # `python -m` puts the notebook's directory first on sys.path: a stray file there
    # (say, traitlets.py) would shadow what the kernel imports while it starts. Like
    # ipykernel_launcher, drop it; IPython adds the working directory back for cells.
    del sys.path[0]

from ipykernel.ipkernel import IPythonKernel  # noqa: E402


class RLMKernel(IPythonKernel):  # type: ignore[misc, unused-ignore]  # ipykernel: untyped
    """IPythonKernel that loads rlm_magic as soon as its shell exists."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # creates self.shell, already holding the user config
        # Loading here, rather than through IPKernelApp.extensions, keeps it working
        # whatever extension options the user's own config sets (those replace, not
        # extend, a list given on the command line). It goes through IPython's extension
        # manager, so `%load_ext rlm_magic` says it is already loaded and
        # `%unload_ext` / `%reload_ext` work as for any extension. It is cheap:
        # rlm_magic imports litellm only on the first model call.
        try:
            self.shell.extension_manager.load_extension("rlm_magic")
        except Exception:  # noqa: BLE001 - a broken extension must not kill the kernel
            self.log.exception(
                "rlm_magic could not be loaded; run %load_ext rlm_magic to see the error"
            )


def main() -> None:
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=RLMKernel)


if __name__ == "__main__":
    main()
