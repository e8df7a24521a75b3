"""Typed answers (``response_format=``) against the local server, through litellm."""

from __future__ import annotations

import ast
import json
import socket
import warnings
from typing import Literal

import pytest
from pydantic import BaseModel

from rlm_magic import BatchError
from rlm_magic.demo import HTTPError
from rlm_magic.errors import ConfigError
from rlm_magic.llm.structured import AnswerFormat
from rlm_magic.maps.jobs import batch_job

from .support import helpers, make_rlm
from .support.backends import SANDBOXES


class Label(BaseModel):
    sentiment: Literal["positive", "negative", "neutral"]
    score: int


def labelled(body: dict) -> str:
    prompt = body["messages"][0]["content"].split("\n")[0]  # the question, as first asked
    if "broken" in prompt:
        return "I think it is negative."  # never valid
    return json.dumps(
        {"sentiment": "positive" if "good" in prompt else "negative", "score": len(prompt)}
    )


@pytest.fixture
def rlm(server, tmp_path):
    server.reply_with("sub-model", labelled)
    server.reply_with("gpt-4o-mini", labelled)
    return make_rlm(server, cache_dir=str(tmp_path))


async def test_a_pydantic_model_gives_an_instance_of_it(rlm):
    answer = await helpers(rlm).llm_query("good", response_format=Label)
    assert answer == Label(sentiment="positive", score=4)


async def test_a_model_litellm_does_not_know_is_sent_the_schema_and_given_it_in_the_prompt(
    rlm, server
):
    # Its server is not known yet: the schema goes both ways (a server that ignores
    # response_format still has it in the prompt).
    await helpers(rlm).llm_query("good", response_format=Label)
    request = server.requests[0]
    assert request["response_format"]["type"] == "json_schema"
    assert "matching this JSON schema" in request["messages"][-1]["content"]


async def test_a_model_at_llama_cpp_or_vllm_is_sent_the_schema_alone(rlm, server):
    server.reports_window = ("llama.cpp", 8192)  # the probe of the first call finds it
    await helpers(rlm).llm_query("good", response_format=Label)
    answer = await helpers(rlm).llm_query("good too", response_format=Label)
    assert answer == Label(sentiment="positive", score=8)
    request = server.requests[-1]
    assert request["response_format"]["type"] == "json_schema"
    assert request["messages"][-1]["content"] == "good too"


async def test_a_server_that_refuses_the_schema_gets_json_mode_at_once_and_says_so_once(
    rlm, server
):
    def no_schema(body: dict) -> str:
        if (body.get("response_format") or {}).get("type") == "json_schema":
            raise HTTPError(
                400, "response_format type must be one of 'text' or 'json_object'", "invalid"
            )
        return labelled(body)

    server.reply_with("sub-model", no_schema)
    with pytest.warns(RuntimeWarning, match="the JSON schema is not sent.*its server refused"):
        assert await helpers(rlm).llm_query("good", response_format=Label) == Label(
            sentiment="positive", score=4
        )
    sent = [r["response_format"]["type"] for r in server.requests]
    assert sent == ["json_schema", "json_object"]  # asked again at once, in JSON mode
    assert "matching this JSON schema" in server.requests[1]["messages"][-1]["content"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        answers = await helpers(rlm).llm_query_batch(["good", "bad"], response_format=Label)
    assert [a.sentiment for a in answers] == ["positive", "negative"]
    assert [r["response_format"]["type"] for r in server.requests[2:]] == ["json_object"] * 2


async def test_a_model_litellm_says_takes_schemas_gets_the_schema_itself(server, tmp_path):
    server.reply_with("gpt-4o-mini", labelled)
    rlm = make_rlm(server, cache_dir=str(tmp_path), sub_model="openai/gpt-4o-mini")
    await helpers(rlm).llm_query("good", response_format=Label)
    sent = server.requests[0]["response_format"]
    assert sent["type"] == "json_schema"
    assert sent["json_schema"]["schema"]["properties"]["sentiment"]["enum"] == [
        "positive",
        "negative",
        "neutral",
    ]
    assert server.requests[0]["messages"][-1]["content"] == "good"


async def test_an_invalid_answer_is_asked_again_once_with_the_error(rlm, server):
    server.script("sub-model", ['{"sentiment": "great", "score": 1}'])
    assert await helpers(rlm).llm_query("good", response_format=Label) == Label(
        sentiment="positive", score=4
    )
    retry = server.requests[1]["messages"]
    assert retry[-2] == {"role": "assistant", "content": '{"sentiment": "great", "score": 1}'}
    assert retry[-1]["content"].startswith(
        "That answer is not valid (sentiment: Input should be 'positive', 'negative' or 'neutral')"
    )


async def test_an_answer_invalid_twice_is_that_items_error_and_the_others_are_kept(rlm, server):
    with pytest.raises(BatchError) as caught:
        await helpers(rlm).llm_query_batch(["good", "broken"], response_format=Label)
    assert caught.value.results == [Label(sentiment="positive", score=4), None]
    assert "did not match the schema twice" in str(caught.value.errors[1])
    assert len(server.requests) == 3  # the good one once, the broken one twice


async def test_a_json_schema_gives_dicts(rlm):
    schema = {
        "type": "object",
        "properties": {"sentiment": {"type": "string"}, "score": {"type": "integer"}},
        "required": ["sentiment", "score"],
    }
    answers = await helpers(rlm).llm_query_batch(["good", "bad"], response_format=schema)
    assert answers == [{"sentiment": "positive", "score": 4}, {"sentiment": "negative", "score": 3}]


SCORE = {"type": "object", "required": ["score"], "properties": {"score": {"type": "integer"}}}


@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_model_code_gets_validated_dicts_from_a_json_schema(server, tmp_path, sandbox):
    server.reply_with("sub-model", labelled)
    server.script(
        "root-model",
        [
            "```repl\n"
            f"schema = {SCORE!r}\n"
            "one = llm_query('good', response_format=schema)\n"
            "many = llm_query_batch(['good', 'bad'], response_format=schema)\n"
            "bad = llm_query('x', response_format={'type': 'no-such-type'})\n"
            "FINAL(repr((one['score'], [m['score'] for m in many], bad)))\n```"
        ],
    )
    result = await make_rlm(server, sandbox=sandbox, cache_dir=str(tmp_path)).arun("q", context="c")
    assert result.success, result.error
    score, scores, bad = ast.literal_eval(result.final_answer)
    assert (score, scores) == (4, [4, 3])
    assert bad.startswith("Error: response_format is not a valid JSON schema: ")
    assert len(server.requests_for("sub-model")) == 3  # the bad schema sent nothing


async def test_a_bad_response_format_is_a_one_line_error(rlm, server):
    with pytest.raises(ConfigError, match="^response_format is not a valid JSON schema: "):
        await helpers(rlm).llm_query("x", response_format={"type": "no-such-type"})
    with pytest.raises(
        ConfigError, match="^response_format must be a pydantic model class or a JSON schema"
    ):
        await helpers(rlm).llm_query_batch(["x"], response_format=str)
    assert server.requests == []


async def test_a_batch_job_gives_typed_answers_and_invalid_ones_are_item_errors(
    rlm, server, monkeypatch
):
    server.batch_jobs.reset(step_s=0.01)
    monkeypatch.setattr(batch_job, "FIRST_POLL_S", 0.02)
    with pytest.raises(BatchError) as caught:
        await helpers(rlm).llm_query_batch(
            ["good", "broken"], response_format=Label, batch_job=True
        )
    assert caught.value.results == [Label(sentiment="positive", score=4), None]
    assert "did not match the schema" in str(caught.value.errors[1])
    [line] = {json.dumps(r.get("response_format")) for r in server.requests}
    assert json.loads(line) == {"type": "json_object"}


def test_a_fenced_json_answer_is_read():
    assert AnswerFormat(Label).parse('```json\n{"sentiment": "neutral", "score": 0}\n```') == Label(
        sentiment="neutral", score=0
    )


@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_a_schema_from_model_code_cannot_make_the_kernel_fetch_a_url(
    server, tmp_path, sandbox
):
    # The sandbox has no network; the kernel must not become its proxy (jsonschema
    # would fetch a remote $ref itself), nor run its regular expressions on the loop.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server.reply_with("sub-model", lambda body: '"x"')
    server.script(
        "root-model",
        [
            "```repl\n"
            "leak = llm_query('q', response_format="
            f"{{'$ref': 'http://127.0.0.1:{port}/?d=' + context}})\n"
            "slow = llm_query('q', response_format={'type': 'string', 'pattern': '^(a+)+$'})\n"
            "FINAL(leak + ' | ' + slow)\n```"
        ],
    )
    result = await make_rlm(server, sandbox=sandbox, cache_dir=str(tmp_path)).arun(
        "q", context="SECRET"
    )
    leak, slow = result.final_answer.split(" | ")
    assert leak.startswith("Error: response_format may refer only to its own definitions")
    assert slow.startswith("Error: response_format from model code may not hold regular")
    listener.settimeout(0.2)
    with pytest.raises(TimeoutError):
        listener.accept()  # nobody connected
    listener.close()
    assert server.requests_for("sub-model") == []


async def test_a_notebook_schema_may_use_patterns_and_its_own_definitions(rlm):
    schema = {
        "$defs": {"score": {"type": "integer"}},
        "type": "object",
        "properties": {
            "sentiment": {"type": "string", "pattern": "^[a-z]+$"},
            "score": {"$ref": "#/$defs/score"},
        },
    }
    assert await helpers(rlm).llm_query("good", response_format=schema) == {
        "sentiment": "positive",
        "score": 4,
    }
