"""One map for the notebook and for model code: model code's ``llm_query_batch`` keeps its
answers for a re-run and gives typed answers through the same code as the notebook's,
reporting in its own way (errors as values, the run's budgets); and one request
identity keys the response cache, kept answers and jobs."""

from __future__ import annotations

import pytest

from rlm_magic import BatchError
from rlm_magic.maps.resume import RESUME_AT

from .support import helpers, make_rlm


def repl(code: str) -> str:
    return f"```repl\n{code}\n```"


def sub_prompts(server) -> list[str]:
    return [r["messages"][-1]["content"] for r in server.requests_for("sub-model")]


def mapped(prompts: list[str], **options) -> list[str]:
    """A root model that maps ``prompts`` in its code and answers with the list."""
    arguments = "".join(f", {name}={value!r}" for name, value in options.items())
    return [repl(f"answers = llm_query_batch({prompts!r}{arguments})"), "FINAL_VAR(answers)"]


async def test_model_code_s_map_keeps_its_answers_and_a_rerun_pays_only_for_the_missing(
    server, tmp_path
):
    prompts = ["ok 1", "bad", "ok 2"]
    server.fail("500", times=1, match="bad")
    server.script("root-model", mapped(prompts, resume=True))
    first = await make_rlm(server, cache_dir=str(tmp_path), max_retries=0).arun("q", context="c")
    assert first.success and "Error: " in first.final_answer
    server.reset()
    server.script("root-model", mapped(prompts, resume=True))
    # A new RLM, as after a kernel restart: only the disk remembers.
    again = make_rlm(server, cache_dir=str(tmp_path), max_retries=0)
    second = await again.arun("q", context="c")
    assert second.final_answer == str([f"echo: {p}" for p in prompts])
    assert sub_prompts(server) == ["bad"]
    assert second.usage.total.cache_hits == 2  # the kept answers cost nothing this time


async def test_model_code_s_long_map_resumes_by_default(server, tmp_path):
    prompts = [f"p{i}" for i in range(RESUME_AT - 1)] + ["bad"]
    server.fail("500", times=1, match="bad")
    server.script("root-model", mapped(prompts))
    await make_rlm(server, cache_dir=str(tmp_path), max_retries=0).arun("q", context="c")
    server.reset()
    server.script("root-model", mapped(prompts))
    await make_rlm(server, cache_dir=str(tmp_path), max_retries=0).arun("q", context="c")
    assert sub_prompts(server) == ["bad"]


async def test_a_map_kept_by_the_notebook_serves_model_code_asking_the_same(server, tmp_path):
    rlm = make_rlm(server, cache_dir=str(tmp_path), max_retries=0)
    server.fail("500", times=1, match="bad")
    with pytest.raises(BatchError):
        await helpers(rlm).llm_query_batch(["ok", "bad"], model="openai/sub-model", resume=True)
    server.reset()
    server.script("root-model", mapped(["ok", "bad"], resume=True))
    result = await rlm.arun("q", context="c")
    assert result.final_answer == str(["echo: ok", "echo: bad"])
    assert sub_prompts(server) == ["bad"]


async def test_model_code_s_batch_job_option_is_ignored_and_runs_ordinary_sub_calls(
    batch_server, tmp_path
):
    # A provider's job outlives any step, and its cost is known only at its end: model
    # code's maps never submit one (the option is ignored, as before).
    batch_server.script("root-model", mapped(["a", "b"], batch_job=True))
    rlm = make_rlm(batch_server, cache_dir=str(tmp_path))
    result = await rlm.arun("q", context="c")
    assert result.final_answer == str(["echo: a", "echo: b"])
    assert batch_server.batch_jobs.batches == {}
    assert sorted(sub_prompts(batch_server)) == ["a", "b"]


async def test_model_code_s_typed_map_gives_validated_dicts(server, tmp_path):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    server.script("sub-model", ['{"n": 1}', '{"n": 2}'])
    server.script(
        "root-model",
        [
            repl(
                f"answers = llm_query_batch(['x', 'y'], response_format={schema!r})\n"
                "total = sum(a['n'] for a in answers)"
            ),
            "FINAL_VAR(total)",
        ],
    )
    result = await make_rlm(server, cache_dir=str(tmp_path)).arun("q", context="c")
    assert result.final_answer == "3"


@pytest.mark.filterwarnings("ignore:max_cost_usd is set")  # the root model is unpriced
async def test_a_map_the_budget_has_no_room_for_sends_nothing(server):
    rlm = make_rlm(server, sub_model="openai/gpt-4o", max_cost_usd=0.001)
    server.script("root-model", [repl("b = llm_query_batch(['x', 'y'])"), "FINAL(z)"])
    result = await rlm.arun("q", context="c")
    refused = result.variables["b"][0]
    assert result.variables["b"] == [refused, refused]
    assert refused.startswith("Error: not sent to 'openai/gpt-4o'")
    assert refused.endswith("has $0.0010 left; 2 of this batch's 2 items were not sent")
    assert not server.requests_for("gpt-4o")


CONVERSATION = [{"role": "user", "content": "q"}]


def test_every_setting_that_shapes_an_answer_keys_the_cache_and_the_map(server):
    rlm = make_rlm(server)

    def keys(model="openai/m", max_tokens=100):
        identity = rlm.client.identity(model, max_tokens)
        return identity.cache_key(CONVERSATION), identity.map_key([CONVERSATION])

    before = keys()
    assert keys() == before
    changed = [keys(model="openai/other"), keys(max_tokens=101)]
    for name, value in [("litellm_kwargs", {"temperature": 0.5}), ("api_base", "http://x:9")]:
        saved = getattr(rlm, name)
        setattr(rlm, name, value)
        changed.append(keys())
        setattr(rlm, name, saved)
    for cache_key, map_key in changed:
        assert cache_key != before[0] and map_key != before[1]


def test_a_typed_answer_s_schema_keys_the_map_and_the_cache_by_what_is_sent(server):
    identity = make_rlm(server).client.identity("openai/m", 100)
    typed = make_rlm(server).client.identity("openai/m", 100, answer_format='{"type":"object"}')
    assert typed.map_key([CONVERSATION]) != identity.map_key([CONVERSATION])
    sent = {"type": "json_object"}  # the schema itself goes in the prompt then
    assert typed.cache_key(CONVERSATION, sent) != identity.cache_key(CONVERSATION)


def test_a_job_s_requests_carry_the_parameters_of_the_identity(server):
    rlm = make_rlm(server, litellm_kwargs={"temperature": 0.5})
    body = rlm.client.identity("openai/m", 100).job_body("m", {"type": "json_object"})
    assert body == {
        "model": "m",
        "max_tokens": 100,
        "temperature": 0.5,
        "response_format": {"type": "json_object"},
    }
