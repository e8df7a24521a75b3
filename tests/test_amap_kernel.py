"""``amap`` in a real Jupyter kernel: the interrupt button stops a pipeline whose functions
are waiting on their own calls, at once, and leaves the finished results by name."""

from __future__ import annotations

import pytest

from .support.kernels import interrupt_and_check

pytestmark = pytest.mark.kernel

PER_ROW = (
    "async def per_row(row):\n"
    "    facts = await llm_query(row)\n"
    "    return await llm_query(f'summary of {facts}')\n"
)


def test_interrupt_stops_an_amap_pipeline_and_keeps_its_finished_results(rlm_kernel, server):
    rlm_kernel.run("%config RLM.progress = True\n" + PER_ROW)
    server.latency_for = lambda body: 0.0 if "fast" in body["messages"][-1]["content"] else 30.0

    def ready(msg_id):
        # The bar shows both fast rows done, and each slow row's first call is at the
        # server (its functions are waiting on their own llm_query).
        shown = [
            m["content"]["data"]["state"].get("value")
            for _, m in rlm_kernel.messages(msg_id, "comm_msg")
            if m["content"]["data"].get("method") == "update"
        ]
        return 2 in shown and server.in_flight == 2

    usage = interrupt_and_check(
        rlm_kernel,
        server,
        "amap pipeline, rlm kernel",
        "await amap(per_row, ['fast 0', 'fast 1', 'slow 0', 'slow 1'])",
        ready,
    )
    assert rlm_kernel.value("rlm_magic.unfinished_batch().results") == [
        "echo: summary of echo: fast 0",
        "echo: summary of echo: fast 1",
        None,
        None,
    ]
    # The functions' calls are the session's: four answered, two cut off.
    assert usage == {"calls": 6, "input_tokens": 40, "errors": 0, "cancelled": 2}, usage
