"""``amap``'s bar counts the calls its own function makes: two maps running at once each
show their own tokens and dollars, not the kernel's calls made meanwhile."""

from __future__ import annotations

import asyncio
import re

from rlm_magic.llm.usage import format_cost

from .support import helpers, make_rlm

SHOWN = re.compile(r"^amap: (\d+)/\d+ done .*\| ([\d,]+) tokens \| (\S+)$")


async def test_two_maps_at_once_each_show_only_their_own_tokens_and_dollars(
    server, capsys, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "200")  # the whole line, not one fitted to 80 columns
    server.latency = 0.1
    rlm = make_rlm(server, progress=True, max_concurrency=8)
    notebook = helpers(rlm)
    # One map asks gpt-4o-mini short questions, the other gpt-4o long ones: each
    # model's totals in the ledger are one map's calls.
    models = {"short": "openai/gpt-4o-mini", "long": "openai/gpt-4o"}

    def asking(kind: str):
        async def per_item(item: int) -> str:
            prompt = f"{kind} {item} " + ("word " * 300 if kind == "long" else "")
            first = await notebook.llm_query(prompt, model=models[kind])
            return await notebook.llm_query(f"again: {first[:40]}", model=models[kind])

        return per_item

    started = asyncio.Event()
    overlapped = []

    async def watch():
        # The two maps' calls interleave: both have calls recorded before either ends.
        await started.wait()
        while len(rlm.client.ledger.summary().by_model) < 2:
            await asyncio.sleep(0.01)
        overlapped.append(True)

    async def both():
        started.set()
        return await asyncio.gather(
            notebook.amap(asking("short"), range(4), concurrency=2),
            notebook.amap(asking("long"), range(4), concurrency=2),
        )

    watcher = asyncio.ensure_future(watch())
    await both()
    await asyncio.wait_for(watcher, 10)
    written = capsys.readouterr().err.split("\n")  # each line rewritten after a "\r"
    lines = [SHOWN.match(line.rsplit("\r", 1)[-1].rstrip()) for line in written]
    shown = [m.groups() for m in lines if m is not None]
    assert len(shown) == 2 and overlapped
    by_model = rlm.client.ledger.summary().by_model
    expected = {
        (
            "4",
            f"{by_model[m].input_tokens + by_model[m].output_tokens:,}",
            format_cost(by_model[m].cost_usd),
        )
        for m in models.values()
    }
    assert set(shown) == expected
    assert by_model[models["short"]].calls == by_model[models["long"]].calls == 8
