"""API keys, over real HTTP with litellm for real: a missing key is one line before
anything is sent, a refused one is one line after one request (never three), a keyless
local server answers with no key set anywhere, and no command shows a key in clear."""

from __future__ import annotations

import pytest

import rlm_magic
from rlm_magic import RLM
from rlm_magic.errors import APIKeyError, BatchError, ConfigError

from .support import helpers, make_rlm, run_cell
from .support.key_server import KEY_VARIABLES, rlm_at

KEY = "sk-the-users-own-0123456789abcdef"


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch, litellm_imported):
    """A user with no key anywhere (and no endpoint of their own in the environment)."""
    for name in KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


# -- no key --------------------------------------------------------------------------


async def test_no_key_is_one_configuration_line_naming_the_variable_and_the_setting():
    rlm = RLM(model="gpt-4o-mini", progress=False, max_retries=2)
    with pytest.raises(ConfigError) as caught:
        await helpers(rlm).llm_query("hi")
    assert isinstance(caught.value, APIKeyError)
    assert str(caught.value) == (
        "no API key for 'gpt-4o-mini': set OPENAI_API_KEY or %config RLM.api_key = ..."
    )
    assert caught.value._render_traceback_() == [f"APIKeyError: {caught.value}"]
    [record] = rlm.client.ledger.records
    assert record.retries == 0 and record.error == str(caught.value)


async def test_no_key_sends_nothing_where_a_key_would_have_been_sent(server, monkeypatch):
    # litellm's anthropic/ provider, pointed at the local server by its own variable:
    # with a key the request reaches the server; without, it is refused before.
    monkeypatch.setenv("ANTHROPIC_API_BASE", server.anthropic_base)
    rlm = RLM(model="anthropic/claude-x", progress=False, max_retries=2, retry_backoff=0.01)
    with pytest.raises(APIKeyError) as caught:
        await helpers(rlm).llm_query("hi")
    assert str(caught.value) == (
        "no API key for 'anthropic/claude-x': set ANTHROPIC_API_KEY or %config RLM.api_key = ..."
    )
    assert server.anthropic_requests == []
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    assert len(server.anthropic_requests) == 1


async def test_a_map_with_no_key_sends_nothing_and_says_so_in_one_line(server, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_BASE", server.anthropic_base)
    rlm = RLM(model="anthropic/claude-x", progress=False)
    with pytest.raises(APIKeyError) as caught:  # not "3 of 3 items failed"
        await helpers(rlm).llm_query_batch(["a", "b", "c"])
    assert str(caught.value) == (
        "no API key for 'anthropic/claude-x': set ANTHROPIC_API_KEY or %config RLM.api_key = ..."
    )
    assert server.anthropic_requests == []
    assert len(rlm_magic.failed_batch().errors) == 3  # each item's error, as ever


async def test_a_map_whose_key_failed_only_some_items_is_a_batch_error(server):
    server.fail("401", times=1, model="sub-model")
    rlm = make_rlm(server, max_retries=0)
    with pytest.raises(BatchError) as caught:
        await helpers(rlm).llm_query_batch(["a", "b"])
    assert len(caught.value.errors) == 1 and caught.value.results.count(None) == 1


# -- a refused key -------------------------------------------------------------------


@pytest.mark.parametrize("wire", [True, False])  # aiohttp straight, or litellm
async def test_a_refused_key_is_one_line_after_one_request_never_three(server, wire):
    server.fail("401", times=5)
    rlm = make_rlm(server, api_key=KEY, max_retries=2, wire_transport=wire)
    with pytest.raises(ConfigError) as caught:
        await helpers(rlm).llm_query("x")
    assert str(caught.value) == (
        "the API key from RLM.api_key was refused for 'openai/sub-model' "
        "(401: injected bad API key): set a valid key in OPENAI_API_KEY or "
        "%config RLM.api_key = ..."
    )
    assert len(server.requests) == 1


async def test_a_refused_key_from_the_environment_names_the_variable(server, monkeypatch):
    echoed = "sk-echoed-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", echoed)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)  # the key's own endpoint
    server.fail("401-echo", times=5)  # a provider that quotes the key it was sent
    rlm = make_rlm(server, api_key=None, max_retries=2)
    with pytest.raises(APIKeyError) as caught:
        await helpers(rlm).llm_query("x")
    message = str(caught.value)
    assert message.startswith("the API key from OPENAI_API_KEY was refused for 'openai/sub-model'")
    assert "Bearer [REDACTED]" in message and echoed not in message
    assert len(server.requests) == 1


# -- a keyless local server ----------------------------------------------------------


@pytest.mark.parametrize("wire", [True, False])
async def test_a_keyless_local_server_answers_with_no_key_set(local, wire):
    rlm = rlm_at(local, wire_transport=wire)
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    # Over the wire no key at all; litellm's OpenAI client will not send without one,
    # so it gets a placeholder such a server ignores.
    assert local.chat_authorizations() == ([None] if wire else ["Bearer no-key-required"])


async def test_openai_base_url_in_the_environment_is_a_keyless_server_too(local, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", local.base_url)
    rlm = RLM(model="openai/sub-model", progress=False)
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    assert local.chat_authorizations() == [None]


async def test_a_local_server_started_with_a_key_says_it_wants_one(local):
    local.required_key = KEY
    rlm = rlm_at(local, max_retries=2)
    with pytest.raises(APIKeyError) as caught:
        await helpers(rlm).llm_query("hi")
    assert str(caught.value) == (
        f"no API key for 'openai/sub-model' (the server at {local.base_url} wants one): "
        "%config RLM.api_key = ..."  # (OPENAI_API_KEY would not be sent there)
    )
    assert len(local.chat_authorizations()) == 1
    rlm.api_key = KEY
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    assert local.chat_authorizations()[-1] == f"Bearer {KEY}"


# -- no command shows a key ----------------------------------------------------------


async def test_config_rlm_shows_every_secret_masked_and_the_settings_still_hold_them(shell, capsys):
    from rlm_magic.jupyter.extension import session_rlm

    header_key, password = "sk-in-a-header-0123456789", "redis-password-0123456789"
    await run_cell(shell, f'%config RLM.api_key = "{KEY}"')
    await run_cell(
        shell,
        '%config RLM.litellm_kwargs = {"extra_headers": {"Authorization": '
        f'"Bearer {header_key}"}}}}',
    )
    await run_cell(shell, f'%config RLM.router_settings = {{"redis_password": "{password}"}}')
    rlm = session_rlm(shell)
    rlm.litellm_kwargs["extra_headers"]["X-Api-Key"] = "sk-set-in-place-0123456789"
    capsys.readouterr()
    await run_cell(shell, "%config RLM")
    shown = capsys.readouterr().out
    assert "Current: 'sk-...cdef'" in shown  # the api_key, masked
    for secret in (KEY, header_key, password, "sk-set-in-place-0123456789"):
        assert secret not in shown
    # %config RLM.api_key returns the setting: its Out is masked too.
    value = await run_cell(shell, "%config RLM.api_key")
    out = shell.display_formatter.format(value)[0]["text/plain"]
    assert out == "'sk-...cdef'" and KEY not in repr(rlm.litellm_kwargs)
    # ... while the settings hold the keys themselves, and calls send them.
    assert value == KEY and str(rlm.api_key) == KEY
    assert f"{rlm.litellm_kwargs['extra_headers']['Authorization']}" == f"Bearer {header_key}"
    assert KEY in rlm.configured_secrets()  # still redacted from everything a model reads
