"""The scripts a new user runs first."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).parent.parent
EXAMPLES = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


def _run_notebook_script():
    spec = importlib.util.spec_from_file_location(
        "run_notebook", ROOT / "scripts" / "run_notebook.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart_summary_shows_the_batch_timing_an_rlm_answer_and_the_usage():
    # The quickstart notebook as saved (executed); quickstart.sh prints this summary.
    notebook = nbformat.read(ROOT / "notebooks" / "01_quickstart.ipynb", as_version=4)
    text = _run_notebook_script().summary(notebook, "01_quickstart.ipynb")
    assert text.startswith("What 01_quickstart.ipynb did:")
    assert "48 prompts at once: " in text and "one at a time: about " in text
    assert '%%rlm --context logs --out res\n  Most "timeout" lines by service: ' in text
    assert "answered · 3 iteration(s)" in text
    usage = text.split("%rlm usage\n")[1].splitlines()
    assert usage[0].split()[:2] == ["model", "calls"]
    assert any(line.split()[0] == "openai/rlm-demo-root" for line in usage[2:])


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_notebooks_show_no_error_outputs(path):
    # What nbval checks against the python3 kernel is the saved notebook: with no error
    # output and no `raises-exception` tag there, papermill runs it in python3 too.
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        assert "raises-exception" not in cell.metadata.get("tags", []), cell.source
        assert all(o.output_type != "error" for o in cell.get("outputs", [])), cell.source
