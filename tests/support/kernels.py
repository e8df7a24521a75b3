"""Real Jupyter kernels driven as a notebook frontend drives them: started from the kernel
specs the session installs (fixtures ``kernel_prefix``, ``kernel_specs``, ``kernel_env``
and ``rlm_kernel`` in ``conftest.py``), pointed at the local server, warmed up, and
interrupted with the time to stop measured (``MEASURED``, printed at the end of a run).

The kernels run in their own processes and reach the local server of the pytest process
over 127.0.0.1."""

from __future__ import annotations

import ast
import contextlib
import queue
import subprocess
import sys
import time
import uuid
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from .measured import MEASURED

# The README promises "within a second"; the figures measured are printed at the end of
# the run. The bound leaves a loaded 2-core machine room (one case waits out a 0.5 s
# grace period by design).
INTERRUPT_LIMIT_S = 2.0


def run_python(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """This interpreter run with ``args`` (``-m jupyter kernelspec ...``), its output kept."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, env=env
    )


def kernel_dir(prefix: Path) -> Path:
    """Where the kernel specs of an installation ``prefix`` live."""
    return prefix / "share" / "jupyter" / "kernels"


# -- driving a kernel ----------------------------------------------------------------
class Kernel:
    """A started kernel with a blocking client; keeps every iopub message it reads,
    with the time it arrived."""

    def __init__(self, name: str, specs: KernelSpecManager, env: dict):
        self.km = KernelManager(kernel_name=name, kernel_spec_manager=specs)
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.iopub: list[tuple[float, dict]] = []

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)

    def submit(self, code: str) -> str:
        """Send an execute_request as a notebook frontend does: naming the cell (as
        JupyterLab and Notebook 7 do), which tells the kernel widgets are rendered."""
        msg = self.kc.session.msg(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": True,
                "stop_on_error": True,
            },
            metadata={"cellId": uuid.uuid4().hex},
        )
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def pump(self, until=lambda: False, timeout: float = 0.02) -> bool:
        """Read iopub messages for up to ``timeout`` s, stopping early once ``until()``."""
        deadline = time.monotonic() + timeout
        while True:
            if until():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return until()
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 0.01))
            except queue.Empty:
                continue
            self.iopub.append((time.perf_counter(), msg))

    def messages(self, msg_id: str, msg_type: str | None = None) -> list[tuple[float, dict]]:
        return [
            (t, m)
            for t, m in self.iopub
            if m["parent_header"].get("msg_id") == msg_id
            and (msg_type is None or m["msg_type"] == msg_type)
        ]

    def _idle(self, msg_id: str) -> bool:
        return any(
            m["content"].get("execution_state") == "idle"
            for _, m in self.messages(msg_id, "status")
        )

    def wait(self, msg_id: str, timeout: float = 60) -> tuple[dict, float]:
        """The execute_reply of ``msg_id`` and when it arrived; then drains its iopub."""
        deadline = time.monotonic() + timeout
        reply = None
        while reply is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no execute_reply within {timeout}s")
            if self.kc.shell_channel.msg_ready():
                msg = self.kc.get_shell_msg(timeout=1)
                if msg["parent_header"].get("msg_id") == msg_id:
                    reply, arrived = msg, time.perf_counter()
                continue
            self.pump(timeout=0.005)
        assert self.pump(lambda: self._idle(msg_id), timeout=max(deadline - time.monotonic(), 5))
        return reply["content"], arrived

    def run(self, code: str, timeout: float = 60) -> str:
        """Run a cell that must succeed; returns its text output (stdout + result)."""
        msg_id = self.submit(code)
        reply, _ = self.wait(msg_id, timeout)
        assert reply["status"] == "ok", (
            f"{code!r} failed: {reply.get('ename')}: "
            f"{reply.get('evalue')}\n" + "\n".join(reply.get("traceback", []))
        )
        out = []
        for _, msg in self.messages(msg_id):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "execute_result":
                out.append(msg["content"]["data"]["text/plain"])
        return "".join(out)

    def value(self, expr: str, timeout: float = 60):
        return ast.literal_eval(self.run(expr, timeout).strip())


def configure(kernel: Kernel, server) -> None:
    kernel.run(
        "\n".join(
            [
                f'%config RLM.api_base = "{server.base_url}"',
                '%config RLM.model = "openai/root-model"',
                '%config RLM.sub_model = "openai/sub-model"',
                '%config RLM.api_key = "sk-test"',
                "%config RLM.retry_backoff = 0.01",
                "%config RLM.timeout = 60.0",
            ]
        )
    )


def warm_up(kernel: Kernel) -> None:
    """Pay the one-time costs before anything is timed: the first model call imports
    litellm (~3 s), and IPython's first traceback takes ~0.5 s (stack_data, pygments)."""
    assert kernel.value('await llm_query("hi")', timeout=90) == "echo: hi"
    msg_id = kernel.submit("await llm_query(1)")  # raises ConfigError through a helper
    assert kernel.wait(msg_id)[0]["ename"] == "ConfigError"


@contextlib.contextmanager
def ready_kernel(name: str, kernel_specs, kernel_env, llm_server, load_ext: bool = False):
    """A started kernel, pointed at the local server and warmed up; stopped afterwards."""
    kernel = Kernel(name, kernel_specs, kernel_env)
    try:
        if load_ext:
            assert "llm_query" not in kernel.run("%who_ls")
            kernel.run("%load_ext rlm_magic")
        configure(kernel, llm_server)
        llm_server.reset()
        warm_up(kernel)
        yield kernel
    finally:
        kernel.stop()


# -- interrupts ---------------------------------------------------------------------
def interrupt_timed(kernel: Kernel, msg_id: str, label: str) -> tuple[dict, float]:
    """Interrupt the kernel while ``msg_id`` runs; its execute_reply and how long it took,
    recorded under ``label`` and checked against INTERRUPT_LIMIT_S."""
    interrupted = time.perf_counter()
    kernel.km.interrupt_kernel()
    reply, replied = kernel.wait(msg_id, timeout=60)
    elapsed = MEASURED[label] = replied - interrupted
    assert elapsed <= INTERRUPT_LIMIT_S, f"[{label}] took {elapsed:.3f}s to stop"
    return reply, elapsed


def interrupt_and_check(
    kernel: Kernel, server, label: str, code: str, ready, ready_timeout: float = 30
) -> dict:
    """Run ``code``, interrupt it once ``ready(msg_id)``, and check the kernel stopped
    it at once and cleanly. Returns the usage delta of the cell, as seen in the kernel."""
    kernel.run(
        "import signal, rlm_magic, rlm_magic.jupyter.interrupts\n"
        "_sigint_before = signal.getsignal(signal.SIGINT)\n"
        "_usage_before = rlm_magic.usage()"
    )
    msg_id = kernel.submit(code)
    assert kernel.pump(lambda: ready(msg_id), timeout=ready_timeout), (
        f"[{label}] the cell never got going (server: {len(server.requests)} requests, "
        f"{server.in_flight} in flight)"
    )
    in_flight = server.in_flight
    reply, elapsed = interrupt_timed(kernel, msg_id, label)
    print(
        f"\n[{label}] interrupt -> execute_reply: {elapsed:.3f}s "
        f"({in_flight} requests were in flight)"
    )
    assert reply["status"] == "error", f"[{label}] cell finished {reply['status']!r}"
    assert reply["ename"] == "KeyboardInterrupt", f"[{label}] {reply['ename']}: {reply['evalue']}"
    # One clear line, like any interrupted cell: no frames of rlm-magic's internals, and
    # not the rewritten line a %%rlm cell runs as.
    assert len(reply["traceback"]) == 1, "\n".join(reply["traceback"])
    assert reply["traceback"][0] == f"KeyboardInterrupt: {reply['evalue']}"
    assert " interrupted" in reply["evalue"], reply["evalue"]
    assert server.wait_for(lambda: server.in_flight == 0, timeout=10), (
        f"[{label}] {server.in_flight} requests still open after the interrupt"
    )
    assert kernel.value("1 + 1") == 2
    assert kernel.value("signal.getsignal(signal.SIGINT) is _sigint_before") is True
    assert kernel.value(
        "(rlm_magic.jupyter.interrupts._guarded, rlm_magic.jupyter.interrupts._previous_handler)"
    ) == ({}, None)
    return kernel.value(
        "_u = rlm_magic.usage(); {'calls': _u.calls - _usage_before.calls, "
        "'input_tokens': _u.input_tokens - _usage_before.input_tokens, "
        "'errors': _u.total.errors - _usage_before.total.errors, "
        "'cancelled': _u.total.cancelled - _usage_before.total.cancelled}"
    )


def into_the_step_after_its_sub_call(server):
    """``interrupt_and_check``'s ``ready`` for a step that makes one sub-call and then
    runs on: true once the sub-model was asked, and a moment after, so the interrupt
    lands in the step's last statement."""

    def ready(msg_id: str) -> bool:
        if len(server.requests_for("sub-model")) < 1:
            return False
        time.sleep(0.3)  # past the sub-call, into the step's last statement
        return True

    return ready
