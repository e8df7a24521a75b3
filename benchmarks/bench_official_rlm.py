"""bench_transport.py's scripted RLM run, by the official RLM library (PyPI ``rlms``).

The same run as ``bench_transport.py``'s last section: the root model (0.5 s a turn)
chunks a 4,000-line log into 64 parts and asks the sub-model (0.3 s) about each in one
batch, then finishes. The server is the same (``tests/support/llm_server.py``'s, in a process
of its own); only the root's replies are written in the library's words: its batch is
``llm_query_batched``, and a run ends when code sets ``answer["ready"] = True``. The
library runs as it comes (its batch sends 16 sub-calls at a time, unstreamed).

The library cannot share rlm-magic's environment, so it runs from a scratch one:

    python -m venv /tmp/rlms && /tmp/rlms/bin/pip install rlms
    /tmp/rlms/bin/python benchmarks/bench_official_rlm.py --server-python .venv/bin/python

``bench_transport.py --official-python /tmp/rlms/bin/python`` runs it beside ours and
prints the ratio. Prints one JSON line: the library's version and each run's wall time.
``--serve`` (run by ``--server-python``): the scripted server itself.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIRST_TURN = (
    "I split the context into 64 parts and ask about each.\n```repl\n"
    "size = len(context) // 64 + 1\n"
    "parts = [context[i:i + size] for i in range(0, len(context), size)]\n"
    "answers = llm_query_batched([f'Summarise: {p[:200]}' for p in parts])\n"
    "print(len(answers))\n```"
)
LAST_TURN = (
    "The parts are summarised.\n```repl\n"
    'answer["content"] = str(len(answers))\nanswer["ready"] = True\n```'
)


def rlm_context() -> str:
    """bench_transport.py's context, line for line."""
    return "".join(f"line {i}: some log text about service {i % 7}\n" for i in range(4000))


def serve(root_s: float, sub_s: float) -> None:
    """The scripted server (rlm-magic's environment: tests/support/llm_server.py)."""
    sys.path.insert(0, str(ROOT))
    from tests.support.llm_server import FakeLLMServer

    def root_turn(body: dict) -> str:
        return LAST_TURN if any(m["role"] == "assistant" for m in body["messages"]) else FIRST_TURN

    server = FakeLLMServer().start()
    server.model_latency = {"root": root_s, "sub": sub_s}
    server.reply_with("root", root_turn)
    print(server.base_url, flush=True)
    sys.stdin.read()  # until the benchmark closes its end
    server.stop()


def run(base_url: str) -> float:
    from rlm import RLM

    kwargs = {"api_key": "sk-bench", "base_url": base_url}
    rlm = RLM(
        backend="openai",
        backend_kwargs={**kwargs, "model_name": "root"},
        other_backends=["openai"],
        other_backend_kwargs=[{**kwargs, "model_name": "sub"}],
        environment="local",
        max_iterations=4,
    )
    started = time.perf_counter()
    result = rlm.completion(rlm_context(), root_prompt="Summarise the log")
    wall = time.perf_counter() - started
    assert str(result.response).strip() == "64", result.response
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-python", default=str(ROOT / ".venv/bin/python"))
    parser.add_argument("--root", type=float, default=0.5, help="root turn latency (0.5)")
    parser.add_argument("--sub", type=float, default=0.3, help="sub-call latency (0.3)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.root, args.sub)
        return
    from importlib.metadata import version

    server = subprocess.Popen(
        [args.server_python, __file__, "--serve", f"--root={args.root}", f"--sub={args.sub}"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        base_url = server.stdout.readline().strip()
        if not base_url.startswith("http"):
            raise SystemExit("the scripted server did not start")
        run(base_url)  # warm up: imports, the first connections
        walls = [run(base_url) for _ in range(args.runs)]
    finally:
        server.stdin.close()
        server.wait(10)
    print(json.dumps({"rlms": version("rlms"), "walls": walls}), flush=True)


if __name__ == "__main__":
    main()
