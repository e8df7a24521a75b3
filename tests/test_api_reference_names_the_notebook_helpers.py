"""The API reference names the helpers a notebook calls most (``llm_query``,
``llm_query_batch``, ``rlm_query``, ``rlm_query_batch``), each with its signature and its
docstring (what it returns and raises), generated from the code."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest

from rlm_magic.jupyter.helpers import NotebookHelpers

ROOT = Path(__file__).parent.parent
spec = importlib.util.spec_from_file_location(
    "rlm_reference_helpers", ROOT / "docs" / "_ext" / "rlm_reference.py"
)
assert spec is not None and spec.loader is not None
reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reference)


@pytest.mark.parametrize("name", ["llm_query", "llm_query_batch", "rlm_query", "rlm_query_batch"])
def test_each_helper_has_its_signature_and_docstring_on_the_api_page(name):
    page = reference.api_markdown()
    method = getattr(NotebookHelpers, name)
    parameters = list(inspect.signature(method).parameters)[1:]
    line = next(x for x in page.splitlines() if x.startswith(f".. py:function:: {name}("))
    assert all(p in line for p in parameters), line
    first = inspect.getdoc(method).splitlines()[0]
    assert f"   {first}" in page.splitlines()
    assert "   :async:" in page


def test_what_the_helpers_raise_is_named():
    page = reference.api_markdown()
    for error in ("LLMQueryError", "BatchError", "RLMRunError"):
        assert error in page.split("## Notebook helpers", 1)[1], error
