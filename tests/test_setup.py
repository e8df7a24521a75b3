"""What a new user meets before the first call: the package's import, the scripts of the
first hour (lab.sh, the ./.venv they share) and the wheel's metadata."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def _fresh_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=120,
    )


@pytest.mark.slow  # a fresh interpreter importing litellm
def test_importing_the_package_keeps_a_later_import_litellm_off_the_network():
    # A dead proxy: a price-map fetch would log litellm's "fetch attempt ... failed".
    done = _fresh_python(
        "import os, sys, rlm_magic\n"
        "assert 'litellm' not in sys.modules, 'the package must not import litellm'\n"
        "print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'])\n"
        "import litellm\n",
        HTTPS_PROXY="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert "cost map" not in done.stderr.lower(), done.stderr


def test_a_users_own_cost_map_setting_is_kept():
    done = _fresh_python(
        "import os, rlm_magic; print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'])",
        LITELLM_LOCAL_MODEL_COST_MAP="False",
    )
    assert done.stdout.strip() == "False"


def _scripts_copy(tmp_path: Path, python_script: str) -> Path:
    """The scripts in a folder of their own, with a stand-in ./.venv whose python and
    jupyter only say what they were asked (nothing is installed or started)."""
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in (
        ("python", python_script),
        ("jupyter", 'echo "jupyter $*"\n'),
    ):
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    return tmp_path


# Saving an example keeps its stored kernel metadata (scripts/jupyter_server_config.py).
CONFIG = "--config=scripts/jupyter_server_config.py"


@pytest.mark.skipif(os.name != "posix", reason="bash scripts")
def test_lab_sh_as_root_passes_allow_root_and_says_so(tmp_path):
    repo = _scripts_copy(tmp_path, "exit 0\n")
    done = subprocess.run(
        ["bash", "scripts/lab.sh", "--no-browser"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
        # (nor the venv CI named for another Python's run: VENV=.venv-3.10)
        env={k: v for k, v in os.environ.items() if k not in ("PYTHON", "VENV")},
    )
    assert done.returncode == 0, done.stderr
    if os.geteuid() == 0:
        assert done.stdout.strip() == f"jupyter lab notebooks {CONFIG} --allow-root --no-browser"
        assert (
            done.stderr.strip() == "lab.sh: running as root, so passing --allow-root to jupyter lab"
        )
    else:
        assert done.stdout.strip() == f"jupyter lab notebooks {CONFIG} --no-browser"


@pytest.mark.skipif(os.name != "posix", reason="bash scripts")
def test_a_venv_of_another_python_than_PYTHON_is_refused_in_one_line(tmp_path):
    # ./.venv's python says 3.8; PYTHON names this interpreter.
    repo = _scripts_copy(tmp_path, 'case "$*" in *version_info*) echo 3.8;; esac\nexit 0\n')
    done = subprocess.run(
        ["bash", "scripts/test.sh", "--fast"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
        env={**{k: v for k, v in os.environ.items() if k != "VENV"}, "PYTHON": sys.executable},
    )
    this = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"./.venv is Python 3.8, but PYTHON={sys.executable} is Python {this}: remove .venv "
        f"(rm -rf .venv) to rebuild it with {sys.executable}, or unset PYTHON"
    )
    assert (repo / ".venv" / "bin" / "python").exists()  # left as it was


def test_the_wheel_says_where_the_project_lives_and_what_it_runs_on():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classifiers = project["classifiers"]
    for version in ("3.10", "3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "Framework :: Jupyter" in classifiers
    assert project["requires-python"] == ">=3.10"


@pytest.mark.slow  # a notebook run in a fresh kernel
@pytest.mark.skipif(os.name != "posix", reason="Unix sockets")
def test_a_headless_notebook_run_prints_no_kernel_transport_warning_and_leaves_no_files(
    tmp_path,
):
    # quickstart.sh's runner: ipykernel warns on every start over TCP ("Kernel is
    # running over TCP without encryption"); the kernel is local, so it gets Unix
    # sockets, removed with the kernel.
    import nbformat

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    path = tmp_path / "tiny.ipynb"
    nbformat.write(notebook, path)
    runtime = Path(tempfile.mkdtemp(prefix="rt-"))  # short: a socket's path is bounded
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_notebook.py"), str(path)]
        + ["--out", str(tmp_path / "out.ipynb")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime)},
    )
    assert done.returncode == 0, done.stderr
    assert "without encryption" not in done.stderr and "WARNING" not in done.stderr
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "42\n"
    assert list(runtime.iterdir()) == []
    runtime.rmdir()
