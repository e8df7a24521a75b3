"""The offline demo model: deterministic, honest, and on the real HTTP path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from rlm_magic import RLM, demo

from .support import run_cell


def make_logs(lines: int = 3000) -> str:
    services = ["auth", "checkout", "inventory", "payments", "search"]
    rows = []
    for i in range(lines):
        service = services[(i * 7) % 5]
        message = "timeout calling upstream" if i % (3 + services.index(service)) == 0 else "ok"
        rows.append(f"2026-11-18T10:{i % 60:02d} service={service} level=INFO msg={message}")
    return "\n".join(rows)


@pytest.fixture
def demo_rlm():
    rlm = RLM(progress=False)
    demo.start(rlm, root_latency=0.05, sub_latency=0.05)
    yield rlm
    demo.stop(rlm)


def test_sub_model_counts_lines_by_rule():
    prompt = (
        "Count the lines that contain 'timeout', grouped by 'service'. Answer in JSON.\n\n"
        "service=a timeout\nservice=b ok\nservice=a TIMEOUT again\nservice=b timeout"
    )
    assert json.loads(demo.sub_reply(prompt)) == {"a": 2, "b": 1}
    assert json.loads(demo.sub_reply("Count the lines that contain 'ok'.\n\nok\nno")) == {
        "count": 1
    }


@pytest.mark.parametrize(
    "review, label",
    [
        ("I love it, works great", "positive"),
        ("Terrible, it broke after a day", "negative"),
        ("It is a phone", "neutral"),
    ],
)
def test_sub_model_classifies_sentiment(review, label):
    assert demo.sub_reply(f"Classify the sentiment of this review: {review}") == label


def test_sub_model_says_what_it_is_for_anything_else():
    assert demo.sub_reply("Write a poem").startswith("[demo model]")
    assert demo.sub_reply("Hello").endswith("yours had 1 word.")


async def test_a_question_the_demo_cannot_answer_fails_the_run(demo_rlm):
    result = await demo_rlm.arun("What is the meaning of life?", context="some text")
    assert not result.success and result.stop_reason == "error"
    assert "[demo model] the demo answers counting questions" in result.error
    assert "rlm-failed" in result._repr_html_()  # shown in red, not as an answer


@pytest.mark.slow  # a fresh interpreter importing litellm
def test_starting_the_demo_does_not_wait_for_litellm():
    # A fresh process, where litellm is not imported yet (the import takes seconds).
    code = """if True:
        import asyncio, sys, time
        from rlm_magic import RLM, demo
        from rlm_magic.jupyter.helpers import NotebookHelpers
        rlm = RLM(progress=False)
        started = time.perf_counter()
        demo.start(rlm)
        print(round(time.perf_counter() - started, 3))
        started = time.perf_counter()
        asyncio.run(NotebookHelpers(rlm).llm_query("Classify the sentiment: good"))
        print(round(time.perf_counter() - started, 3))  # litellm's import is in this one
        print(rlm.usage().cost_usd > 0)  # the pretend prices were registered in time
    """
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert done.returncode == 0, done.stderr
    starting, first_call, priced = done.stdout.split()
    # Side by side, so a loaded machine slows both: starting is a fraction of the first
    # call, which waits for litellm's import.
    assert float(starting) < float(first_call) / 2 and priced == "True"


async def test_demo_root_answers_a_counting_question_over_a_long_document(demo_rlm):
    logs = make_logs()
    result = await demo_rlm.arun('Which service has the most "timeout" lines?', context=logs)
    truth = Counter(
        line.split()[1].split("=")[1] for line in logs.splitlines() if "timeout" in line
    )
    top, count = truth.most_common(1)[0]
    assert result.success
    assert result.final_answer.startswith(f'Most "timeout" lines by service: {top}: {count}')
    assert result.iterations == 3
    assert result.trajectory[1].sub_calls == 16  # it fanned out with one batch
    assert result.usage.cost_usd > 0  # pretend prices, so cost accounting shows


async def test_demo_root_uses_child_rlms_for_a_dict_of_documents(demo_rlm):
    docs = {"monday": make_logs(300), "tuesday": make_logs(600)}
    result = await demo_rlm.arun('How many "timeout" lines are in each document?', context=docs)
    assert result.success and result.trajectory[1].sub_calls == 2
    expected = {
        day: sum("timeout" in line for line in text.splitlines()) for day, text in docs.items()
    }
    assert result.final_answer == (
        f'monday: {expected["monday"]} lines contain "timeout"; '
        f'tuesday: {expected["tuesday"]} lines contain "timeout"'
    )


async def test_demo_is_deterministic(demo_rlm):
    logs = make_logs(500)
    first = await demo_rlm.arun('How many lines contain "timeout"?', context=logs)
    second = await demo_rlm.arun('How many lines contain "timeout"?', context=logs)
    assert first.final_answer == second.final_answer
    assert first.usage.total.total_tokens == second.usage.total.total_tokens


async def test_rlm_demo_magic_points_settings_at_it_and_stop_restores(shell, capsys):
    from rlm_magic.jupyter.extension import session_rlm

    rlm = session_rlm(shell)
    before = rlm.model
    shell.run_line_magic("rlm", "demo")
    assert "not a language model" in capsys.readouterr().out
    assert rlm.model == "openai/rlm-demo-root" and rlm.api_base.startswith("http://127.0.0.1:")
    assert (
        await run_cell(shell, "await llm_query('Classify the sentiment: I love it')") == "positive"
    )
    shell.run_line_magic("rlm", "demo stop")
    assert rlm.model == before
