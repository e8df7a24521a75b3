"""A real LiteLLM Proxy (litellm's own ``litellm --config``) on 127.0.0.1, in front of
the local test server, for the tests of the proxy path.

It runs without a database, so only what works without one is used: the master key,
model groups, a deployment's ``rpm`` and ``max_parallel_requests`` (answered with 429
when exceeded), its cost header, and batch jobs (``files_settings``). Starting it takes
several seconds, so the tests share one per session.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

MASTER_KEY = "sk-proxy-master-key-for-tests"
# Each group's deployment, upstream, and the limits the proxy enforces on it.
GROUPS = {
    "root": {"model": "openai/root-model"},
    "sub": {"model": "openai/sub-model"},
    # Few slots: two kernels at full concurrency meet this limit for sure.
    "limited": {"model": "openai/sub-model", "rpm": 1000, "max_parallel_requests": 3},
    # A model litellm prices, so the proxy reports the cost of each call.
    "priced": {"model": "openai/gpt-4o-mini"},
}


def _config(upstream: str) -> str:
    lines = ["model_list:"]
    for group, params in GROUPS.items():
        lines += [
            f"  - model_name: {group}",
            "    litellm_params:",
            f"      api_base: {upstream}",
            "      api_key: sk-upstream",
        ]
        lines += [f"      {name}: {value}" for name, value in params.items()]
    lines += [
        "general_settings:",
        f"  master_key: {MASTER_KEY}",
        # The proxy's own retries would hold a request while it waits; the
        # client's rate gate is what is under test.
        "router_settings:",
        "  num_retries: 0",
        # Where the proxy's Files and Batches endpoints send batch jobs (no database
        # needed for that).
        "files_settings:",
        "  - custom_llm_provider: openai",
        f"    api_base: {upstream}",
        "    api_key: sk-upstream",
    ]
    return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiteLLMProxy:
    def __init__(self, upstream: str, workdir: Path):
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = workdir / "proxy.yaml"
        config.write_text(_config(upstream))
        self.log = (workdir / "proxy.log").open("w")
        executable = Path(sys.executable).with_name("litellm")
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        self.process = subprocess.Popen(
            [
                str(executable),
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            cwd=workdir,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the LiteLLM Proxy exited: see {self.log.name}")
            try:
                with urllib.request.urlopen(
                    f"{self.base_url}/health/liveliness", timeout=1
                ) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"the LiteLLM Proxy did not start in {timeout}s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()
