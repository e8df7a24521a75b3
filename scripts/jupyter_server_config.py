"""JupyterLab as ``scripts/lab.sh`` runs it: saving an example notebook keeps the kernel
metadata it is stored with.

On connecting, JupyterLab writes the running kernel's spec and Python version into the
notebook (``kernelspec``, ``language_info``), and autosave then saves it: with another
Python than the one the examples were saved with, or the "Python 3 (RLM)" kernel,
merely opening one dirtied the clone. This hook puts the stored values back before a
save, so a notebook saved unchanged is written byte for byte as it was.
"""

from __future__ import annotations

import json
import os

KEPT = ("kernelspec", "language_info")


def keep_stored_kernel_metadata(model, path, contents_manager, **_):
    """jupyter_server's ``pre_save_hook``: a notebook already on disk keeps its stored
    ``kernelspec`` and ``language_info``."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    try:
        with open(os.path.join(contents_manager.root_dir, path), encoding="utf-8") as file:
            stored = json.load(file).get("metadata", {})
    except (OSError, ValueError):
        return  # a new notebook, or one that is not JSON: saved as it comes
    metadata = model["content"].setdefault("metadata", {})
    for key in KEPT:
        if key in stored:
            metadata[key] = stored[key]


def keeping_stored_kernel_metadata(manager_class: type) -> type:
    """``manager_class`` with ``keep_stored_kernel_metadata`` registered on each manager
    once, as it is made. Not set as ``FileContentsManager.pre_save_hook``: jupyter lab
    applies its configuration to the contents manager twice (once more when it loads
    its extensions), and each setting of that trait registers the hook again, with a
    warning ("Overriding existing pre_save_hook ...")."""

    class KeptKernelMetadata(manager_class):  # type: ignore[valid-type,misc]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.register_pre_save_hook(keep_stored_kernel_metadata)

    KeptKernelMetadata.__name__ = f"KeptKernelMetadata{manager_class.__name__}"
    return KeptKernelMetadata


if "c" in globals():  # read by jupyter lab --config (c is its configuration)
    from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

    # (jupyter_server's default manager, with the hook.)
    c.ServerApp.contents_manager_class = keeping_stored_kernel_metadata(AsyncLargeFileManager)  # type: ignore[name-defined]  # noqa: F821
