"""Where model code runs is a backend named by ``RLM.sandbox`` (issue 40): a registry of
values, ``auto`` choosing the strongest that works on this machine and saying so once,
and the wasm backend's install path failing in one line that says what to do."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import warnings

import pytest

from rlm_magic.config import SANDBOX_KINDS
from rlm_magic.errors import SandboxError
from rlm_magic.repl import backends
from rlm_magic.repl.backends import wasm
from rlm_magic.repl.base import SandboxSettings


@pytest.fixture
def fresh_choice(monkeypatch):
    """``auto`` decided again, as in a new kernel."""
    backends.chosen.cache_clear()
    monkeypatch.setattr(backends, "_unsaid", [])
    yield
    backends.chosen.cache_clear()


def test_the_setting_accepts_exactly_the_registered_backends_and_auto():
    assert set(SANDBOX_KINDS) == set(backends.NAMES)
    assert backends.named("wasm") is backends.WASM
    with pytest.raises(ValueError, match="sandbox must be one of auto, process, wasm"):
        backends.named("docker")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's choice")
def test_auto_is_the_process_sandbox_where_linux_gives_user_namespaces(fresh_choice):
    if not backends.user_namespaces_work():
        pytest.skip("this machine refuses user namespaces")
    assert backends.chosen() is backends.PROCESS
    said = backends.said_once()
    assert said is not None and "sandbox process" in said and "\n" not in said
    assert backends.said_once() is None  # once per kernel


def test_auto_is_the_wasm_sandbox_where_user_namespaces_are_refused(fresh_choice, monkeypatch):
    monkeypatch.setattr(backends, "user_namespaces_work", lambda: False)
    monkeypatch.setattr(wasm, "unavailable", lambda: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a real sandbox: nothing to warn about
        assert backends.chosen() is backends.WASM
    assert "WebAssembly" in (backends.said_once() or "")


def test_without_deno_auto_warns_naming_what_is_missing_and_the_command(fresh_choice, monkeypatch):
    monkeypatch.setattr(backends, "user_namespaces_work", lambda: False)
    monkeypatch.setattr(wasm, "unavailable", lambda: "Deno is not installed")
    with pytest.warns(RuntimeWarning) as caught:
        fallback = backends.chosen()
    assert fallback is (backends.NONE if sys.platform == "win32" else backends.PROCESS)
    (warning,) = caught
    text = str(warning.message)
    assert "pip install 'rlm-magic[wasm]'" in text and "\n" not in text
    if sys.platform.startswith("linux"):  # the layers missing, and those that still hold
        assert "without the user, PID and process-count layers" in text
        assert "the syscall filter and Landlock still hold" in text
    else:
        assert "read your files" in text or "keys and network" in text
    assert backends.said_once() is None  # the warning says it: no note besides


def test_the_wasm_backend_without_deno_says_the_one_command(monkeypatch):
    monkeypatch.setattr(wasm, "deno_binary", lambda: None)
    assert wasm.unavailable() == "Deno is not installed (pip install 'rlm-magic[wasm]')"
    with pytest.raises(SandboxError, match=r"needs Deno, which is not installed: pip install"):
        asyncio.run(wasm.launch((), SandboxSettings()))


@pytest.mark.skipif(wasm.deno_binary() is None, reason="Deno is not installed")
def test_pyodide_that_cannot_be_fetched_fails_in_one_line_saying_how_to_install_offline(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("RLM_WASM_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", "http://127.0.0.1:9/")  # nothing listens
    with pytest.raises(SandboxError) as caught:
        wasm.fetch_pyodide(str(wasm.deno_binary()))
    message = str(caught.value)
    assert "\n" not in message
    assert f"Pyodide {wasm.PYODIDE_VERSION}" in message
    assert "python -m rlm_magic.repl.backends.wasm" in message
    assert "RLM_WASM_CACHE" in message and "NPM_CONFIG_REGISTRY" in message


def test_a_session_keeps_the_backend_it_began_on(rlm):
    rlm.sandbox = "none"
    session = rlm.session("kept", "wasm")
    rlm.sandbox = "process"
    assert session.sandbox is backends.WASM
    assert session.summary()["sandbox"] == "wasm"


def test_the_package_imports_where_the_posix_only_modules_are_missing():
    # Windows has no resource, fcntl, termios, pwd or grp: the wasm sandbox, the one
    # that isolates there, must be reachable without them.
    code = (
        "import sys\n"
        "for name in ('resource', 'fcntl', 'termios', 'pwd', 'grp'):\n"
        "    sys.modules[name] = None\n"
        "import rlm_magic, rlm_magic.jupyter.extension, rlm_magic.rlm.workspace\n"
        "from rlm_magic.repl.backends import named, wasm, container\n"
        "print(named('wasm').name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "wasm"


def test_the_runner_loads_the_pyodide_the_kernel_fetches_and_reports_its_layers():
    runner = (wasm.HOST / "runner.js").read_text()
    assert f'from "npm:pyodide@{wasm.PYODIDE_VERSION}"' in runner
    worker = (wasm.HOST / "pyodide_worker.py").read_text()
    for layer in wasm.WasmProcess.LAYERS:  # the worker says each layer the kernel reads
        assert f'"{layer}":' in worker, layer
