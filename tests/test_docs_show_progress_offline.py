"""The documentation's tutorial pages show the notebooks' progress lines offline: as the
text each widget output carries, with no script from a CDN (the widgets needed two)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
WIDGET = "application/vnd.jupyter.widget-view+json"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


def test_the_docs_render_widget_outputs_as_their_text_and_load_no_widget_scripts():
    conf = runpy.run_path(str(ROOT / "docs" / "conf.py"))
    assert ("html", WIDGET, None) in [tuple(x) for x in conf["nb_mime_priority_overrides"]]
    assert conf["nb_ipywidgets_js"] == {}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_progress_widget_in_the_notebooks_carries_its_line_as_text(path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET in data:
                assert "".join(data.get("text/plain", "")).strip(), cell["source"]
