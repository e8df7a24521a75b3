"""The old module paths and names (``rlm_magic._moved``) have an end: each warning says
the release that removes them, and that release cannot ship with them still here."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import rlm_magic
from rlm_magic import _moved


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3])


def test_the_release_that_removes_the_old_paths_is_not_this_one():
    assert _release(rlm_magic.__version__) < _release(_moved.REMOVED_IN), (
        f"rlm-magic {rlm_magic.__version__} is the release that removes the old paths: "
        "delete rlm_magic/_moved.py and its install() call"
    )


@pytest.mark.parametrize("old", sorted(_moved.MOVED) + sorted(_moved.NAMES))
def test_every_old_path_names_the_release_that_removes_it(old):
    if old in _moved.MOVED or getattr(sys.modules.get(old), "__file__", None) is None:
        sys.modules.pop(old, None)  # an alias or a module that is gone: imported anew
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
        moved = [name for name in _moved.NAMES.get(old, {}) if name not in vars(module)]
        for name in moved:
            getattr(module, name)
    if old in _moved.NAMES and not moved and old in sys.modules:
        pytest.skip(f"every old name of {old} is there again (imported there)")
    said = [str(warning.message) for warning in caught if warning.category is DeprecationWarning]
    assert said, f"importing {old} gave no DeprecationWarning"
    assert all(f"removed in rlm-magic {_moved.REMOVED_IN}" in text for text in said), said
