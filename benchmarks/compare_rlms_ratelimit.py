"""The official RLM library's batch (PyPI ``rlms``) against the same rate-limited server.

It cannot share rlm-magic's environment, so run it from a scratch one:

    python -m venv /tmp/rlms && /tmp/rlms/bin/pip install rlms
    /tmp/rlms/bin/python benchmarks/compare_rlms_ratelimit.py --server-python .venv/bin/python

The server (``tests/support/llm_server.py``, run by ``--server-python``, which has rlm-magic)
allows 50 requests/s with a burst of 50 and answers after 0.3 s, as in
``bench_ratelimit.py``. The library's ``llm_query_batched`` path is
``LMHandler._handle_batched``: a semaphore of ``batch_max_concurrent`` (16 by default)
over its OpenAI client, whose SDK retries a 429 twice, honouring ``retry-after``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-python", default=str(ROOT / ".venv/bin/python"))
    parser.add_argument("--prompts", type=int, default=300)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    args = parser.parse_args()

    from rlm.clients.openai import OpenAIClient
    from rlm.core.comms_utils import LMRequest
    from rlm.core.lm_handler import LMHandler, LMRequestHandler

    for concurrency in args.concurrency:
        server = subprocess.Popen(
            [
                args.server_python,
                "-m",
                "tests.support.llm_server",
                "--latency",
                "0.3",
                "--rps",
                "50",
                "--burst",
                "50",
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            base_url = server.stdout.readline().strip()
            client = OpenAIClient(api_key="sk-bench", model_name="bench", base_url=base_url)
            handler = LMHandler(client, batch_max_concurrent=concurrency)
            prompts = [f"{i:06d} question" for i in range(args.prompts)]
            started = time.perf_counter()
            response = LMRequestHandler._handle_batched(None, LMRequest(prompts=prompts), handler)
            wall = time.perf_counter() - started
            failed = sum(c.error is not None for c in response.chat_completions)
            server.stdin.write("stats\n")
            server.stdin.flush()
            stats = json.loads(server.stdout.readline())
        finally:
            server.kill()
        ideal = (args.prompts - 50) / 50 + 0.3
        print(
            f"rlms {_version()} batch_max_concurrent={concurrency}: wall {wall:.2f}s "
            f"({wall / ideal:.2f}x the {ideal:.2f}s the limit allows) | "
            f"failed {failed} of {args.prompts} | rejected {stats['rejected']} "
            f"({stats['rejected'] / args.prompts:.0%})"
        )


def _version() -> str:
    from importlib.metadata import version

    return version("rlms")


if __name__ == "__main__":
    sys.exit(main())
