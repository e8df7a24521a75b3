"""An answer that is not whole is told apart from code, says why in plain words, and is
never lost: not to a dead server, not to an interrupt. Over real HTTP against the local
test server, through both transports."""

from __future__ import annotations

import asyncio
import json
import pickle
import signal

import pytest

import rlm_magic
from rlm_magic import CutAnswer
from rlm_magic.jupyter.extension import session_rlm

from .support import cell_result, helpers, make_rlm
from .support.conversations import long_conversation

WORDS = 200


def long_answer(body: dict) -> str:
    return "".join(f"w{i} " for i in range(WORDS))


@pytest.fixture(params=["wire", "litellm"])
def transport(request) -> dict:
    return {"wire_transport": request.param == "wire"}


# -- what a cut answer is --------------------------------------------------------------


def test_a_cut_answer_is_a_str_whose_marker_stops_it_parsing_as_whole():
    answer = CutAnswer("[1, 2, 3", "no new tokens for 30s")
    assert isinstance(answer, str)
    assert answer.text == "[1, 2, 3" and answer.reason == "no new tokens for 30s"
    assert answer == "[1, 2, 3\n[answer cut off: no new tokens for 30s]"
    with pytest.raises(json.JSONDecodeError):
        json.loads(answer)
    with pytest.raises(ValueError):
        int(CutAnswer("12", "interrupted"))  # "12" of "1234" is not read as a number


def test_an_answer_at_max_tokens_is_cut_but_carries_no_marker():
    answer = CutAnswer("The answer is", "it reached its max_tokens", broken_off=False)
    assert answer == "The answer is" and not answer.broken_off


def test_a_cut_answer_survives_pickling_as_itself():
    answer = pickle.loads(pickle.dumps(CutAnswer("part", "interrupted")))
    assert isinstance(answer, CutAnswer) and answer.reason == "interrupted"
    assert answer == "part\n[answer cut off: interrupted]"


# -- cut answers from a real server ------------------------------------------------------


async def test_an_answer_whose_server_went_away_says_so_in_plain_words(server, transport):
    server.reply_with("sub-model", long_answer)
    server.drop_at = 30
    answer = await helpers(make_rlm(server, **transport)).llm_query("q")
    assert isinstance(answer, CutAnswer) and answer.broken_off
    assert answer.text == long_answer({})[: len(answer.text)] and len(answer.text) >= 100
    assert answer.reason.startswith("the server closed the connection after ")
    assert answer.reason.endswith("characters, before the answer's end")
    assert "400" not in answer.reason and "Error" not in answer.reason
    assert len(server.requests) == 1


async def test_an_answer_stopped_at_max_tokens_is_a_cut_answer_without_a_marker(server, transport):
    server.reply_with("sub-model", long_answer)
    server.enforce_max_tokens = True  # it stops after 4 characters a token
    answer = await helpers(make_rlm(server, **transport)).llm_query("q", max_tokens=5)
    assert isinstance(answer, CutAnswer) and not answer.broken_off
    assert answer == answer.text and answer.reason == "it reached its max_tokens"


async def test_a_whole_answer_is_a_plain_str(server, transport):
    answer = await helpers(make_rlm(server, **transport)).llm_query("q")
    assert type(answer) is str


# -- an interrupt keeps what arrived ----------------------------------------------------


@pytest.fixture
def sigint_as_in_a_kernel():
    """SIGINT handled as a kernel handles it: it stops the cell, not the process."""
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    yield
    signal.signal(signal.SIGINT, previous)


async def test_an_interrupted_batch_keeps_each_answer_it_cut_off(
    shell, server, transport, sigint_as_in_a_kernel
):
    rlm = session_rlm(shell)
    rlm.wire_transport = transport["wire_transport"]
    server.generation_rate = 40  # five seconds an answer
    server.reply_with("sub-model", long_answer)
    server.latency_for = lambda body: 30 if "slow" in body["messages"][-1]["content"] else 0
    calls_before = len(rlm.client.ledger)
    code = "await llm_query_batch(['slow'] + [f'q{i}' for i in range(8)])"
    cell = asyncio.ensure_future(cell_result(shell, code))
    # Each of the eight has streamed a fifth of its answer; the slow one, nothing.
    assert await asyncio.to_thread(server.wait_for, lambda: server.chunks_sent >= 8 * 40, 30)
    signal.raise_signal(signal.SIGINT)
    error = (await cell).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    assert str(error).startswith(
        "llm_query_batch interrupted: the 0 of 9 answers that had arrived are in "
        "rlm_magic.unfinished_batch().results, with the parts of 8 it cut off"
    )
    slow, *cut = rlm_magic.unfinished_batch().results
    assert slow is None  # nothing had arrived
    assert all(isinstance(answer, CutAnswer) for answer in cut)
    assert all(answer.reason == "interrupted" for answer in cut)
    assert all(long_answer({}).startswith(answer.text) for answer in cut)
    assert all(len(answer.text) >= 40 for answer in cut)
    # What was generated was billed: the calls count as cancelled, with their tokens.
    records = rlm.client.ledger.records[calls_before:]
    assert [r.error for r in records] == ["cancelled"] * 9
    tokens = sorted(r.output_tokens for r in records)
    assert tokens[0] == 0 and all(count >= 10 for count in tokens[1:])


async def test_an_interrupted_llm_query_keeps_the_part_of_its_answer_that_arrived(
    shell, server, transport, sigint_as_in_a_kernel
):
    rlm = session_rlm(shell)
    rlm.wire_transport = transport["wire_transport"]
    server.generation_rate = 40  # five seconds an answer
    server.reply_with("sub-model", long_answer)
    code = "await llm_query('q')"
    cell = asyncio.ensure_future(cell_result(shell, code))
    assert await asyncio.to_thread(server.wait_for, lambda: server.chunks_sent >= 40, 30)
    signal.raise_signal(signal.SIGINT)
    error = (await cell).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    (answer,) = rlm_magic.unfinished_batch().results
    assert isinstance(answer, CutAnswer) and answer.reason == "interrupted"
    assert len(answer.text) >= 40 and long_answer({}).startswith(answer.text)
    assert str(error) == (
        f"llm_query interrupted: the {len(answer.text):,} characters of its answer that had "
        "arrived are in rlm_magic.unfinished_batch().results[0] (a CutAnswer)"
    )


async def test_an_llm_query_interrupted_before_its_answer_began_keeps_nothing(
    shell, server, sigint_as_in_a_kernel
):
    server.latency_for = lambda body: 30
    before = rlm_magic.unfinished_batch()
    code = "await llm_query('q')"
    cell = asyncio.ensure_future(cell_result(shell, code))
    assert await asyncio.to_thread(server.wait_for, lambda: len(server.requests) >= 1, 30)
    signal.raise_signal(signal.SIGINT)
    error = (await cell).error_in_exec
    assert isinstance(error, KeyboardInterrupt) and str(error) == "llm_query interrupted"
    assert rlm_magic.unfinished_batch() is before  # nothing new to keep


# -- a summary cut at its budget --------------------------------------------------------


async def test_a_summary_asked_again_shorter_gets_half_the_budget(server):
    server.enforce_max_tokens = True
    server.reply_with("root-model", lambda body: "summary " * 400)  # never ends in time
    rlm = make_rlm(server)
    await long_conversation(rlm).compact(1, "threshold")
    first, again = (request["max_tokens"] for request in server.requests_for("root-model"))
    assert again == first // 2
    words = int(again * 0.6)
    assert f"keep this one under {words:,} words" in server.requests[-1]["messages"][-1]["content"]


# -- what a cut answer cost --------------------------------------------------------------


async def test_a_stream_cut_before_its_usage_is_counted_at_the_models_learned_rate(server):
    server.usage = None
    server.chars_per_token = 1.75  # a small model's tokenizer: litellm's reads fewer
    rlm = make_rlm(server)  # (the wire transport, with litellm imported)
    server.reply_with("sub-model", "ok")
    prose = "the quick brown fox jumps over the lazy dog "
    await helpers(rlm).llm_query(prose * 50)  # teaches 1.75 a token
    server.reply_with("sub-model", lambda body: prose * 20)
    server.drop_at = 60  # its stream ends before the usage report
    answer = await helpers(rlm).llm_query("q")
    assert isinstance(answer, CutAnswer)
    record = rlm.client.ledger.records[-1]
    assert record.output_tokens == pytest.approx(len(answer.text) / 1.75, rel=0.05)
