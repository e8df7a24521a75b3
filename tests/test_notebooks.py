"""The example notebooks as stored: byte for byte what JupyterLab saves, so opening one
leaves the clone clean, and tutorials whose checks stay out of the story.

JupyterLab 4 autosaves a notebook once something marks it changed. Opening one changes
nothing if the file is what the server would write (nbformat 4.5, with cell ids, written
by nbformat) and the metadata JupyterLab sets on connecting to the kernel (``kernelspec``
from the kernel's spec, ``language_info`` from its kernel_info reply) already holds the
same values: it compares them before setting. Widget state stays as stored unless the
user turns on "Save Widget State Automatically".
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import nbformat
import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9]*.ipynb"))


def _read(path: Path):
    return nbformat.read(path, as_version=nbformat.NO_CONVERT)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_stored_as_jupyter_saves_it(path):
    # jupyter_server saves with nbformat.write: what it would write is what is stored,
    # so a save (or an autosave) after opening rewrites nothing. Re-executing a notebook
    # with scripts/refresh_notebooks.sh writes it this way too.
    nb = _read(path)
    written = io.StringIO()
    nbformat.write(nb, written)
    assert written.getvalue().encode("utf-8") == path.read_bytes()
    nbformat.validate(nb)
    # JupyterLab 4 upgrades an older minor version on load, and gives cells ids.
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    assert all(cell.get("id") for cell in nb.cells)
    # Per-cell trust is the server's, stripped when it saves.
    assert not any("trusted" in cell.metadata for cell in nb.cells)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_kernel_metadata_is_what_jupyterlab_sets_on_opening(path):
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.kernelspec import get_kernel_dict

    nb = _read(path)
    spec = get_kernel_dict()
    assert nb.metadata.kernelspec == {
        "name": "python3",
        "display_name": spec["display_name"],
        "language": spec["language"],
    }
    # The kernel's own language_info, but for the Python version: that is the one field
    # a kernel of another Python rewrites (see docs/dev/notebooks.md).
    stored = dict(nb.metadata.language_info)
    expected = dict(IPythonKernel.language_info)
    assert re.fullmatch(r"3\.\d+\.\d+", stored.pop("version"))
    expected.pop("version")
    assert stored == expected


def test_every_notebook_names_one_python_version():
    # Refreshed together (scripts/refresh_notebooks.sh), under one Python.
    versions = {_read(p).metadata.language_info.version for p in EXAMPLES}
    assert len(versions) == 1, versions


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_checks_stay_out_of_the_story(path):
    # A user copies the cells: CI's checks sit in the last cell, which shows nothing.
    code = [cell for cell in _read(path).cells if cell.cell_type == "code"]
    *story, last = code
    for cell in story:
        assert not re.search(r"^\s*assert\b", cell.source, re.M), cell.source
        assert "NBVAL_" not in cell.source, cell.source  # tags (metadata) instead
    if re.search(r"^\s*assert\b", last.source, re.M):
        assert last.source.startswith("# What CI checks"), last.source
        assert last.outputs == []


def test_saved_through_lab_sh_a_notebook_keeps_the_kernel_metadata_it_is_stored_with(tmp_path):
    # JupyterLab writes the running kernel's spec and Python version into a notebook on
    # opening; scripts/lab.sh's pre-save hook puts the stored ones back before a save
    # (checked against a real JupyterLab 4.6 server: 6 of 6 examples dirtied without
    # it under another Python, none with it).
    import json
    import runpy
    from types import SimpleNamespace

    hook = runpy.run_path(
        str(Path(__file__).parent.parent / "scripts" / "jupyter_server_config.py")
    )["keep_stored_kernel_metadata"]
    stored = EXAMPLES[0]
    (tmp_path / stored.name).write_bytes(stored.read_bytes())
    content = json.loads(stored.read_text(encoding="utf-8"))
    content["metadata"]["language_info"]["version"] = "3.99.0"  # another Python's kernel
    content["metadata"]["kernelspec"] = {"name": "rlm", "display_name": "Python 3 (RLM)"}
    model = {"type": "notebook", "content": content}
    hook(model=model, path=stored.name, contents_manager=SimpleNamespace(root_dir=tmp_path))
    written = io.StringIO()
    nbformat.write(nbformat.from_dict(model["content"]), written)
    assert written.getvalue().encode("utf-8") == stored.read_bytes()
    new = {"type": "notebook", "content": {"metadata": {"kernelspec": {"name": "rlm"}}}}
    hook(model=new, path="new.ipynb", contents_manager=SimpleNamespace(root_dir=tmp_path))
    assert new["content"]["metadata"]["kernelspec"] == {"name": "rlm"}  # a new one as it is
