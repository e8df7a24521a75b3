"""``scripts/lab.sh``'s server keeps a notebook's stored kernel metadata with one
pre-save hook, registered once per contents manager however often jupyter lab applies
its configuration (it does twice: setting ``pre_save_hook`` warned "Overriding existing
pre_save_hook" and ran the hook twice a save)."""

from __future__ import annotations

import runpy
import sys
import types
import warnings
from pathlib import Path

import pytest
from traitlets.config import Config

CONFIG = Path(__file__).parent.parent / "scripts" / "jupyter_server_config.py"


class _Manager:
    """What the hook's registration uses of jupyter_server's contents manager."""

    def __init__(self, **kwargs):
        self.hooks: list = []

    def register_pre_save_hook(self, hook):
        self.hooks.append(hook)


def _read_config(monkeypatch, manager_class=None) -> tuple[Config, dict]:
    if manager_class is not None:  # jupyter_server not installed: its module's stand-in
        module = types.ModuleType("jupyter_server.services.contents.largefilemanager")
        module.AsyncLargeFileManager = manager_class  # type: ignore[attr-defined]
        for name in (
            "jupyter_server",
            "jupyter_server.services",
            "jupyter_server.services.contents",
        ):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setitem(sys.modules, module.__name__, module)
    c = Config()
    names = runpy.run_path(str(CONFIG), init_globals={"c": c})
    return c, names


def test_the_config_registers_the_hook_once_per_manager_not_as_a_trait(monkeypatch):
    c, names = _read_config(monkeypatch, _Manager)
    assert "pre_save_hook" not in c.FileContentsManager  # the trait that registered twice
    manager = c.ServerApp.contents_manager_class()
    assert isinstance(manager, _Manager)
    assert manager.hooks == [names["keep_stored_kernel_metadata"]]


def test_with_jupyter_server_a_save_runs_the_hook_once_and_nothing_warns(monkeypatch, tmp_path):
    pytest.importorskip("jupyter_server")
    c, names = _read_config(monkeypatch)
    c.FileContentsManager.root_dir = str(tmp_path)
    calls = []
    hook = names["keep_stored_kernel_metadata"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        manager = c.ServerApp.contents_manager_class(config=c)
        manager.update_config(c)  # as jupyter lab does again once its extensions load
        manager.update_config(Config(c))
    assert manager.pre_save_hook is None and len(manager._pre_save_hooks) == 1
    assert manager._pre_save_hooks[0] is hook
    manager._pre_save_hooks[0] = lambda **kw: calls.append(kw["path"]) or hook(**kw)
    manager.run_pre_save_hooks(model={"type": "file", "content": "x"}, path="a.txt")
    assert calls == ["a.txt"]
