"""Resumable maps: answers kept on disk as they arrive, so a re-run sends only what is
missing (``llm_query_batch(..., resume=...)``)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, field_validator

from rlm_magic import RLM, BatchError

from .support import helpers, make_rlm
from .support.resumable_maps import interrupted_after, maps_in


async def test_a_rerun_after_an_interrupt_sends_only_the_missing_prompts(server, tmp_path):
    rlm = make_rlm(server, cache_dir=str(tmp_path))
    prompts = ["fast 1", "slow 1", "fast 2", "slow 2", "fast 3"]
    server.latency_for = lambda body: 30 if "slow" in body["messages"][-1]["content"] else 0
    await interrupted_after(rlm, server, prompts, 3, resume=True)
    server.reset()
    # A new RLM, as after a kernel restart: only the disk remembers.
    again = make_rlm(server, cache_dir=str(tmp_path))
    assert await helpers(again).llm_query_batch(prompts, resume=True) == [
        f"echo: {p}" for p in prompts
    ]
    assert sorted(r["messages"][-1]["content"] for r in server.requests) == ["slow 1", "slow 2"]
    # The kept answers cost nothing this time: they count as cache hits.
    assert again.client.ledger.summary().total.cache_hits == 3


async def test_answers_are_kept_as_json_lines_under_the_cache_folder(server, tmp_path):
    rlm = make_rlm(server, cache_dir=str(tmp_path))
    server.latency_for = lambda body: 30 if "slow" in body["messages"][-1]["content"] else 0
    await interrupted_after(rlm, server, ["kept", "slow"], 1, resume=True)
    [path] = maps_in(tmp_path)
    assert [json.loads(line)["text"] for line in path.read_text().splitlines()] == ["echo: kept"]


async def test_a_finished_map_leaves_no_file_behind(server, tmp_path):
    rlm = make_rlm(server, cache_dir=str(tmp_path))
    await helpers(rlm).llm_query_batch(["a", "b"], resume=True)
    assert maps_in(tmp_path) == []


async def test_only_the_failed_prompts_are_asked_again(server, tmp_path):
    rlm = make_rlm(server, cache_dir=str(tmp_path), max_retries=0)
    server.fail("500", times=1, match="bad")
    with pytest.raises(BatchError):
        await helpers(rlm).llm_query_batch(["ok", "bad"], resume=True)
    server.reset()
    assert await helpers(rlm).llm_query_batch(["ok", "bad"], resume=True) == [
        "echo: ok",
        "echo: bad",
    ]
    assert [r["messages"][-1]["content"] for r in server.requests] == ["bad"]


async def test_maps_of_100_prompts_or_more_resume_by_default_and_smaller_ones_do_not(
    server, tmp_path
):
    rlm = make_rlm(server, cache_dir=str(tmp_path), max_retries=0)
    server.fail("500", times=2, match="bad")
    with pytest.raises(BatchError):
        await helpers(rlm).llm_query_batch(["ok", "bad"])
    assert maps_in(tmp_path) == []
    with pytest.raises(BatchError):
        await helpers(rlm).llm_query_batch(["bad"] + [f"p{i}" for i in range(99)])
    assert len(maps_in(tmp_path)) == 1


async def test_a_cache_folder_that_cannot_be_written_costs_no_answer(server, tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder should be")
    rlm = make_rlm(server, cache_dir=str(blocked))
    with pytest.warns(RuntimeWarning, match="cannot keep this map's answers on disk"):
        assert await helpers(rlm).llm_query_batch(["a", "b"], resume=True) == ["echo: a", "echo: b"]


def slow_when_asked(server):
    server.latency_for = lambda body: 30 if "slow" in body["messages"][-1]["content"] else 0


async def test_a_rerun_with_another_max_tokens_asks_every_prompt_again(server, tmp_path):
    slow_when_asked(server)
    await interrupted_after(
        make_rlm(server, cache_dir=str(tmp_path), max_tokens=100),
        server,
        ["kept", "slow"],
        1,
        resume=True,
    )
    server.reset()
    # The same call (max_tokens=None), but RLM.max_tokens, what is sent, has changed.
    again = make_rlm(server, cache_dir=str(tmp_path), max_tokens=200)
    await helpers(again).llm_query_batch(["kept", "slow"], resume=True)
    assert sorted(r["messages"][-1]["content"] for r in server.requests) == ["kept", "slow"]
    assert {r["max_tokens"] for r in server.requests} == {200}


async def test_a_rerun_through_another_routing_setup_asks_every_prompt_again(server, tmp_path):
    def routed(model: str) -> RLM:
        return RLM(
            model="root",
            sub_model="sub",
            progress=False,
            cache_dir=str(tmp_path),
            model_list=[
                {
                    "model_name": "sub",
                    "litellm_params": {
                        "model": model,
                        "api_base": server.base_url,
                        "api_key": "sk-1",
                    },
                }
            ],
        )

    slow_when_asked(server)
    await interrupted_after(routed("openai/sub-model"), server, ["kept", "slow"], 1, resume=True)
    server.reset()
    await helpers(routed("openai/other-model")).llm_query_batch(["kept", "slow"], resume=True)
    assert sorted((r["model"], r["messages"][-1]["content"]) for r in server.requests) == [
        ("other-model", "kept"),
        ("other-model", "slow"),
    ]


class Count(BaseModel):
    n: int


class SmallCount(BaseModel):  # the same schema, a stricter check
    n: int

    @field_validator("n")
    @classmethod
    def small(cls, n: int) -> int:
        if n > 9:
            raise ValueError("too large")
        return n


async def test_a_kept_typed_answer_that_no_longer_validates_is_asked_again(server, tmp_path):
    answers = {"kept": '{"n": 42}', "slow": '{"n": 7}'}
    server.reply_with(
        "sub-model", lambda body: answers[body["messages"][0]["content"].split("\n")[0]]
    )
    slow_when_asked(server)
    SmallCount.__name__ = Count.__name__  # nothing in the resume key tells them apart
    rlm = make_rlm(server, cache_dir=str(tmp_path))
    await interrupted_after(rlm, server, ["kept", "slow"], 1, resume=True, response_format=Count)
    server.reset()
    server.reply_with("sub-model", lambda body: '{"n": 3}')
    assert await helpers(rlm).llm_query_batch(
        ["kept", "slow"], resume=True, response_format=SmallCount
    ) == [SmallCount(n=3), SmallCount(n=3)]
    assert len(server.requests) == 2


async def test_an_answer_that_broke_off_is_asked_again_by_a_rerun(server, tmp_path):
    rlm = make_rlm(server, cache_dir=str(tmp_path))
    words = " ".join(f"w{i}" for i in range(20))
    server.default_reply = lambda body: (
        words if "long" in body["messages"][-1]["content"] else "short answer"
    )
    server.drop_at = 10  # the long answer's server goes away midway
    first = await helpers(rlm).llm_query_batch(["short", "long"], resume=True)
    assert first[0] == "short answer" and "[answer cut off: " in first[1]
    server.reset()
    server.default_reply = lambda body: words
    again = make_rlm(server, cache_dir=str(tmp_path))
    assert (await helpers(again).llm_query_batch(["short", "long"], resume=True)) == [
        "short answer",
        words,
    ]
    assert [r["messages"][-1]["content"] for r in server.requests] == ["long"]
    assert maps_in(tmp_path) == []  # every answer whole: the file goes


async def test_a_typed_answer_cut_at_max_tokens_is_asked_again_by_a_rerun(server, tmp_path):
    # "cut" parses, but the model was stopped; "bad" fails, so the map's file stays.
    server.reply_with("sub-model", lambda body: '{"n": 7}')
    server.finish_word = "length"
    server.fail("500", times=1, match="bad")
    rlm = make_rlm(server, cache_dir=str(tmp_path), max_retries=0)
    with pytest.raises(BatchError):
        await helpers(rlm).llm_query_batch(["cut", "bad"], resume=True, response_format=Count)
    server.reset()
    server.reply_with("sub-model", lambda body: '{"n": 3}')
    assert (
        await helpers(rlm).llm_query_batch(["cut", "bad"], resume=True, response_format=Count)
        == [Count(n=3)] * 2
    )
    assert sorted(r["messages"][0]["content"].split("\n")[0] for r in server.requests) == [
        "bad",
        "cut",
    ]
