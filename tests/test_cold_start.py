"""A session's first model call imports litellm, which takes seconds: what a user sees
meanwhile. Each test is a fresh interpreter, where litellm is not imported yet."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

FIRST_BATCH = """
import asyncio, sys
from rlm_magic import RLM
from rlm_magic.jupyter.helpers import NotebookHelpers

async def main():
    rlm = RLM(model="openai/root-model", sub_model="openai/sub-model", api_base=sys.argv[1],
              api_key="sk-test", progress=True)
    assert "litellm" not in sys.modules
    print(await NotebookHelpers(rlm).llm_query_batch(["a", "b"]))

asyncio.run(main())
"""


def test_the_first_batch_says_it_is_loading_litellm_not_that_calls_are_in_flight(server):
    done = subprocess.run(
        [sys.executable, "-c", FIRST_BATCH, server.base_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['echo: a', 'echo: b']"
    # The progress line, as rewritten in place on stderr, one state per rewrite (text
    # mode reads each "\r" as a line end).
    states = [s.strip() for s in done.stderr.splitlines() if s.strip()]
    loading = [s for s in states if "loading litellm…" in s]
    assert loading, states
    assert all("in flight" not in s for s in loading)
    assert states[-1].startswith("llm_query_batch: 2/2 done")
    assert len(server.requests) == 2
