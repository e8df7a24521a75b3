"""The fixtures the test modules share: the local servers, an IPython shell, real
kernels. Everything else a test imports comes from ``tests/support``; nothing imports
from here."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest  # noqa: E402

from .support import MEASURED, make_rlm, server_settings  # noqa: E402
from .support.llm_server import FakeLLMServer  # noqa: E402


def pytest_terminal_summary(terminalreporter):
    if not MEASURED:
        return
    terminalreporter.section("rlm-magic measurements")
    for name, figure in MEASURED.items():
        shown = f"{figure:.3f} s" if isinstance(figure, float) else str(figure)
        terminalreporter.write_line(f"{name}: {shown}")


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: hand the figures over
        workeroutput["rlm_measured"] = dict(MEASURED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    MEASURED.update(getattr(node, "workeroutput", {}).get("rlm_measured", {}))


@pytest.fixture(scope="session")
def llm_server():
    server = FakeLLMServer().start()
    yield server
    server.stop()


def pytest_collection_finish(session):
    """Import litellm once, before the first test, when a test of this process talks to
    the server: its import takes seconds of CPU (minutes on a loaded 2-core machine),
    which counted in the first such test's time limit and failed every test of the
    process with it (a session fixture's error is handed to each of its tests)."""
    if any("litellm_imported" in getattr(item, "fixturenames", ()) for item in session.items):
        from rlm_magic.llm.litellm_loader import import_litellm

        import_litellm()


@pytest.fixture(scope="session")
def litellm_imported():
    """litellm, imported once per test process before any test that talks to the server:
    its import takes seconds (more on a loaded machine), which no test's timing is about.
    (tests/test_cold_start.py looks at a first import, in fresh interpreters.)"""
    from rlm_magic.llm.litellm_loader import import_litellm

    return import_litellm()


@pytest.fixture
def server(llm_server, litellm_imported):
    """The local OpenAI-compatible server, reset for this test, and what this process
    learned about it forgotten (its models' windows): tests share a server's address."""
    from rlm_magic.llm import profiles
    from rlm_magic.rlm.session_budget import forget_kernel_spend

    llm_server.reset()
    profiles.forget()  # windows, characters per token, answer sizes, probes, gates
    forget_kernel_spend()  # the session budget is the kernel's: each test starts at $0
    yield llm_server
    llm_server.reset()
    profiles.forget()


@pytest.fixture
def rlm(server):
    return make_rlm(server)


@pytest.fixture
def batch_server(server, monkeypatch):
    """The local server with its batch jobs forgotten, and polls a few ms apart."""
    from rlm_magic.maps.jobs import batch_job

    server.batch_jobs.reset(step_s=0.05)
    monkeypatch.setattr(batch_job, "FIRST_POLL_S", 0.02)
    monkeypatch.setattr(batch_job, "MAX_POLL_S", 0.05)
    yield server
    server.batch_jobs.reset()


@pytest.fixture(scope="session")
def ipython_shell():
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "rlm_magic")
    yield shell


@pytest.fixture
def shell(ipython_shell, server):
    """An IPython shell with rlm_magic loaded, pointed at the local server."""
    from rlm_magic.jupyter.extension import session_rlm

    rlm = session_rlm(ipython_shell)
    saved = {name: getattr(rlm, name) for name in rlm.class_trait_names(config=True)}
    for name, value in server_settings(server).items():
        setattr(rlm, name, value)
    yield ipython_shell
    for name, value in saved.items():
        setattr(rlm, name, value)
    from rlm_magic.jupyter import extension

    if extension._notebook_ledger(ipython_shell).cost_usd:
        # What a test spent stays in the notebook's ledger, which a reload goes on
        # counting: the next test's RLM starts from $0, as in a new kernel.
        delattr(ipython_shell, extension._LEDGER_ATTR)
        ipython_shell.run_line_magic("reload_ext", "rlm_magic")


@pytest.fixture(scope="session")
def litellm_proxy(llm_server, tmp_path_factory):
    """A real LiteLLM Proxy in front of the local server, shared by the session."""
    from .support.litellm_proxy import LiteLLMProxy

    proxy = LiteLLMProxy(llm_server.base_url, tmp_path_factory.mktemp("litellm-proxy"))
    try:
        proxy.wait_ready()
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(autouse=True)
async def _close_litellm_connections():
    """Each test runs on a loop of its own, and litellm keeps connection pools per loop:
    close this test's before its loop ends, as ``RLM.run`` does."""
    yield
    from rlm_magic.llm.transports import close_loop_clients

    await close_loop_clients()


@pytest.fixture(scope="module")
def recording_server():
    """The test server recording where keys go (``key_server.RecordingServer``)."""
    from .support.key_server import RecordingServer

    server = RecordingServer().start()
    yield server
    server.stop()


@pytest.fixture
def local(recording_server):
    """``recording_server``, fresh: no key required, nothing recorded or learned."""
    from rlm_magic.llm import profiles

    recording_server.reset()
    recording_server.required_key = None
    recording_server.refusal = 401
    recording_server.arrived = []
    profiles.forget()  # what was learned of the server (its kind, windows, slots)
    yield recording_server
    recording_server.reset()
    profiles.forget()


# -- real kernels (``tests/support/kernels.py`` drives them) ------------------------------
@pytest.fixture(scope="session")
def kernel_prefix(tmp_path_factory):
    """A prefix holding the "rlm" spec and this venv's own "python3" spec."""
    from .support.kernels import kernel_dir, run_python

    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    done = run_python("-m", "rlm_magic.jupyter.kernelspec", "install", "--prefix", str(prefix))
    assert done.returncode == 0, done.stderr
    assert str(kernel_dir(prefix) / "rlm") in done.stdout
    done = run_python("-m", "ipykernel", "install", "--prefix", str(prefix))
    assert done.returncode == 0, done.stderr
    return prefix


@pytest.fixture(scope="session")
def kernel_specs(kernel_prefix):
    from jupyter_client.kernelspec import KernelSpecManager

    from .support.kernels import kernel_dir

    return KernelSpecManager(kernel_dirs=[str(kernel_dir(kernel_prefix))])


@pytest.fixture(scope="session")
def kernel_env(tmp_path_factory) -> dict:
    env = dict(os.environ)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["IPYTHONDIR"] = str(tmp_path_factory.mktemp("ipython"))  # no user config
    env.pop("JUPYTER_PATH", None)
    return env


@pytest.fixture(scope="module")
def rlm_kernel(kernel_specs, kernel_env, llm_server):
    """The "rlm" kernel, one per test module: no %load_ext anywhere. Warmed up: litellm
    is imported."""
    from .support.kernels import ready_kernel

    with ready_kernel("rlm", kernel_specs, kernel_env, llm_server) as kernel:
        yield kernel
