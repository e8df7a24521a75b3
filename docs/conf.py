"""Sphinx configuration: MyST Markdown pages, the example notebooks rendered from their
stored outputs (never executed here), and a reference generated from the code
(``_ext/rlm_reference.py``). Built by ``bash scripts/docs.sh``, warnings as errors."""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))  # rlm_magic from this checkout

from rlm_magic import __version__  # noqa: E402

project = "rlm-magic"
author = "the rlm-magic authors"
copyright = "the rlm-magic authors, MIT license"  # noqa: A001 - Sphinx's name
release = version = __version__

extensions = [
    "myst_nb",  # Markdown pages and notebooks (it brings myst_parser)
    "sphinx.ext.autodoc",
    "rlm_reference",  # writes reference/generated/ and copies the notebooks
]

exclude_patterns = ["_build", "**/.ipynb_checkpoints", "_ext"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

# The notebooks are shown as they ran against the demo model (tests/test_notebooks.py and
# nbval keep those outputs true); executing them here would only make the build slow.
nb_execution_mode = "off"
nb_merge_streams = True
nb_output_stderr = "show"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Every reference must resolve: a broken link fails the build (scripts/docs.sh runs -W -n).
nitpicky = True


autodoc_typehints = "none"
autodoc_member_order = "bysource"
default_role = "literal"

html_theme = "furo"
html_title = f"rlm-magic {version}"
html_static_path: list[str] = []
html_show_sourcelink = False

# The progress lines of the tutorial notebooks are shown as the text each widget output
# carries, not as widgets: those need require.js and @jupyter-widgets/html-manager from
# two CDNs, and showed nothing offline. (The line holds all the bar said.)
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
nb_ipywidgets_js: dict[str, dict[str, str]] = {}
