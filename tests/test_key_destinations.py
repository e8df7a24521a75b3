"""Where a key goes, as the Authorization headers arrive at a real server: an
environment key of a public service (OPENAI_API_KEY) goes to that service or to the
base the environment pairs with it, never to another api_base; RLM.api_key goes to the
api_base it is set with, and with none to one provider only; what a local server is
asked besides chat (its window, tokenizer, slots) carries the key its chat calls carry.
Each over the wire transport and through litellm."""

from __future__ import annotations

import os

import pytest

from rlm_magic import RLM
from rlm_magic.errors import APIKeyError, ConfigError
from rlm_magic.llm import keys

from .support import helpers
from .support.key_server import KEY_VARIABLES, rlm_at

ENV_KEY = "sk-from-the-environment-0123456789"
OWN_KEY = "sk-set-in-rlm-api-key-0123456789"
TRANSPORTS = pytest.mark.parametrize("wire", [True, False], ids=["wire", "litellm"])


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch, litellm_imported):
    """A user with no key and no endpoint in the environment, unless a test sets one."""
    for name in KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


# -- an environment key goes to its own service ----------------------------------------


@TRANSPORTS
async def test_openai_api_key_is_not_sent_to_another_api_base(local, monkeypatch, wire):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    rlm = rlm_at(local, wire_transport=wire)
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    # Over the wire no key at all; litellm's client sends nothing without one, so it
    # gets a placeholder (and does not read the environment's).
    assert local.chat_authorizations() == [None if wire else f"Bearer {keys.PLACEHOLDER_KEY}"]
    assert all(ENV_KEY not in str(sent) for _, sent in local.arrived)


@TRANSPORTS
async def test_openai_api_key_goes_to_the_base_the_environment_pairs_with_it(
    local, monkeypatch, wire
):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    # The same base, spelt otherwise: a trailing slash, the scheme in capitals.
    monkeypatch.setenv("OPENAI_BASE_URL", local.base_url.replace("http", "HTTP", 1) + "/")
    rlm = rlm_at(local, wire_transport=wire)
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    assert local.chat_authorizations() == [f"Bearer {ENV_KEY}"]


@TRANSPORTS
async def test_openai_base_url_alone_is_where_openai_api_key_goes(local, monkeypatch, wire):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", local.base_url)
    rlm = rlm_at(local, api_base=None, wire_transport=wire)
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    assert local.chat_authorizations() == [f"Bearer {ENV_KEY}"]


@TRANSPORTS
async def test_rlm_api_key_goes_to_the_api_base_it_is_set_with(local, monkeypatch, wire):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    rlm = rlm_at(local, api_key=OWN_KEY, wire_transport=wire)
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    assert local.chat_authorizations() == [f"Bearer {OWN_KEY}"]


@TRANSPORTS
async def test_a_key_named_for_a_vllm_server_goes_to_its_api_base(local, monkeypatch, wire):
    monkeypatch.setenv("HOSTED_VLLM_API_KEY", ENV_KEY)
    model = "hosted_vllm/sub-model"
    rlm = rlm_at(local, model=model, sub_model=model, wire_transport=wire)
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    assert local.chat_authorizations() == [f"Bearer {ENV_KEY}"]


async def test_openai_api_key_is_not_sent_to_a_model_list_deployment_s_own_api_base(
    local, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    deployment = {"model": "openai/sub-model", "api_base": local.base_url}
    rlm = rlm_at(
        local,
        api_base=None,
        model="fast",
        sub_model="fast",
        model_list=[{"model_name": "fast", "litellm_params": deployment}],
    )
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    assert local.chat_authorizations() == [f"Bearer {keys.PLACEHOLDER_KEY}"]


@TRANSPORTS
@pytest.mark.parametrize("refusal", [401, 403])
async def test_a_server_wanting_the_key_held_back_says_so_in_one_line(
    local, monkeypatch, wire, refusal
):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    local.required_key, local.refusal = ENV_KEY, refusal
    rlm = rlm_at(local, wire_transport=wire, max_retries=2)
    with pytest.raises(APIKeyError) as caught:
        await helpers(rlm).llm_query("hi")
    assert str(caught.value) == (
        f"OPENAI_API_KEY was not sent to {local.base_url} (not OpenAI's); if this server "
        "wants it: %config RLM.api_key = os.environ['OPENAI_API_KEY']"
    )
    assert len(local.chat_authorizations()) == 1  # never retried
    rlm.api_key = os.environ["OPENAI_API_KEY"]  # as the line says
    assert await helpers(rlm).llm_query("hi") == "echo: hi"


def test_an_api_base_is_compared_as_a_url_not_as_text(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "https://Proxy.Example:443/v1/")
    assert keys.foreign_home("openai", "https://proxy.example/v1") is None
    assert keys.foreign_home("openai", "https://api.openai.com/v1") is None
    for elsewhere in (
        "https://proxy.example/v2",
        "http://proxy.example/v1",
        "https://api.openai.com.example/v1",
        "http://127.0.0.1:8080/v1",
    ):
        assert keys.foreign_home("openai", elsewhere) is keys.PUBLIC_HOMES["openai"]


@pytest.mark.parametrize("provider", sorted(keys.PUBLIC_HOMES))
def test_every_public_service_s_key_goes_home_and_nowhere_else(monkeypatch, provider):
    home = keys.PUBLIC_HOMES[provider]
    for name in (*home.variables, *home.bases):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(home.variables[-1], ENV_KEY)
    assert keys.environment_key(provider, f"https://{home.host}/v1") == ENV_KEY
    assert keys.environment_key(provider, None) == ENV_KEY  # its own default endpoint
    assert keys.environment_key(provider, "http://127.0.0.1:8080/v1") is None


async def test_a_third_party_s_key_is_held_back_from_another_api_base(local, monkeypatch):
    monkeypatch.setenv("TOGETHERAI_API_KEY", ENV_KEY)
    model = "together_ai/sub-model"
    rlm = rlm_at(local, model=model, sub_model=model)
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    assert local.chat_authorizations() == [f"Bearer {keys.PLACEHOLDER_KEY}"]


async def test_a_base_paired_with_a_key_in_the_environment_counts_from_the_next_call(
    local, monkeypatch
):
    monkeypatch.setenv("TOGETHERAI_API_KEY", ENV_KEY)
    model = "together_ai/sub-model"
    ask = helpers(rlm_at(local, model=model, sub_model=model)).llm_query
    assert await ask("first") == "echo: first"
    monkeypatch.setenv("TOGETHER_AI_API_BASE", local.base_url)  # the key is this server's
    assert await ask("second") == "echo: second"
    assert local.chat_authorizations() == [f"Bearer {keys.PLACEHOLDER_KEY}", f"Bearer {ENV_KEY}"]


def test_keys_named_for_servers_of_ones_own_go_to_any_api_base(monkeypatch):
    monkeypatch.setenv("HOSTED_VLLM_API_KEY", "vllm-key")
    monkeypatch.setenv("LITELLM_PROXY_API_KEY", "proxy-key")
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    base = "http://10.0.0.5:8000/v1"
    assert keys.environment_key("hosted_vllm", base) == "vllm-key"
    assert keys.environment_key("litellm_proxy", base) == "proxy-key"
    assert keys.environment_key("openai", base) is None
    assert keys.environment_key("openai", None) == ENV_KEY  # OpenAI's own API


# -- what a local server is asked besides chat -----------------------------------------

LOG = "2024-01-01 12:00:01 ERROR svc[42]: x=1 y=2 retry=3\n"


@pytest.mark.parametrize(
    "setting",
    ["environment key paired", "environment key elsewhere", "RLM.api_key"],
)
async def test_a_local_servers_probes_carry_the_key_its_chat_calls_carry(
    local, monkeypatch, setting
):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    if setting == "environment key paired":
        monkeypatch.setenv("OPENAI_BASE_URL", local.base_url)
    local.reports_window = ("llama.cpp", 4096)
    local.slots, local.tokenizes = 2, True
    local.script("root-model", ["FINAL(ok)"])
    rlm = rlm_at(local, sandbox="none", api_key=OWN_KEY if setting == "RLM.api_key" else None)
    await rlm.arun("q", context=LOG * 40)
    asked = {path for path, _ in local.arrived}
    assert {"/props", "/tokenize", "/v1/chat/completions"} <= asked
    [chat] = set(local.chat_authorizations())
    assert local.probe_authorizations() == {chat}
    assert (
        chat
        == {
            "environment key paired": f"Bearer {ENV_KEY}",
            "environment key elsewhere": None,
            "RLM.api_key": f"Bearer {OWN_KEY}",
        }[setting]
    )


def paired_openai_key(monkeypatch, server) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)


def busy_asks(server, path: str) -> set[str | None]:
    return {sent for asked, sent in server.arrived if asked == path}


async def test_asking_a_stalled_llama_cpp_whether_it_works_carries_the_calls_key(
    local, monkeypatch
):
    paired_openai_key(monkeypatch, local)
    local.reports_window = ("llama.cpp", 4096)  # 8 slots, none of them processing
    local.fail("hang", times=1)
    rlm = rlm_at(local, timeout=0.5, max_retries=0)
    with pytest.raises(Exception, match="no new tokens for 0.5s"):
        await helpers(rlm).llm_query("x")
    assert busy_asks(local, "/slots") == {f"Bearer {ENV_KEY}"}


async def test_asking_a_busy_vllm_whether_it_works_carries_the_calls_key(local, monkeypatch):
    paired_openai_key(monkeypatch, local)
    # Two slots, eight calls: those queued there ask its /metrics whether it works.
    local.slots, local.reports_window, local.generation_rate = 2, ("vllm", 8192), 40
    local.reply_with("sub-model", lambda body: "".join(f"s{i} " for i in range(20)))
    rlm = rlm_at(local, timeout=0.6, max_concurrency=8)
    await helpers(rlm).llm_query_batch([f"q{i}" for i in range(8)], return_exceptions=True)
    assert busy_asks(local, "/metrics") == {f"Bearer {ENV_KEY}"}


# -- one RLM.api_key, one provider -------------------------------------------------------


async def test_one_api_key_for_two_providers_is_one_line_before_anything_is_sent(
    local, monkeypatch
):
    # Each provider's own endpoint, as its variable names it: here, the test server.
    monkeypatch.setenv("OPENAI_BASE_URL", local.base_url)
    monkeypatch.setenv("ANTHROPIC_API_BASE", local.anthropic_base)
    rlm = rlm_at(
        local,
        model="anthropic/claude-sonnet-4-5",
        sub_model="gpt-4o-mini",
        api_base=None,
        api_key=OWN_KEY,
    )
    with pytest.raises(ConfigError) as caught:
        await helpers(rlm).llm_query("hi")
    assert str(caught.value) == (
        "RLM.api_key would be sent to two providers: 'anthropic/claude-sonnet-4-5' "
        "(anthropic) and 'gpt-4o-mini' (openai); leave RLM.api_key unset so each reads "
        "its own environment variable, or give each model its key in RLM.model_list"
    )
    assert local.arrived == [] and local.anthropic_requests == []


async def test_an_api_base_takes_one_key_for_every_model(local, litellm_imported):
    rlm = rlm_at(local, model="anthropic/claude-x", api_key=OWN_KEY)
    assert keys.api_key_across_providers(litellm_imported, rlm, "openai/sub-model") is None
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    assert local.chat_authorizations() == [f"Bearer {OWN_KEY}"]


def test_models_of_one_provider_share_rlm_api_key(litellm_imported):
    rlm = RLM(model="gpt-4o-mini", sub_model="openai/gpt-4o", api_key=OWN_KEY)
    assert keys.api_key_across_providers(litellm_imported, rlm, "gpt-4o-mini") is None
    assert keys.api_key_across_providers(None, rlm, "text-completion-openai/x") is None


def test_two_providers_are_told_apart_without_litellm_by_prefix_or_family():
    rlm = RLM(model="claude-sonnet-4-5", sub_model="openai/gpt-4o-mini", api_key=OWN_KEY)
    error = keys.api_key_across_providers(None, rlm, "openai/gpt-4o-mini")
    assert error is not None and "'claude-sonnet-4-5' (anthropic)" in str(error)
    assert not keys.key_check_needs_litellm(rlm, "openai/gpt-4o-mini")


@pytest.mark.parametrize("root", ["command-r", "meta-llama/Llama-3.1-8B"])
def test_a_name_of_no_known_provider_needs_litellm_to_be_checked(root):
    rlm = RLM(model=root, sub_model="openai/gpt-4o-mini", api_key=OWN_KEY)
    assert keys.api_key_across_providers(None, rlm, "openai/gpt-4o-mini") is None
    assert keys.key_check_needs_litellm(rlm, "openai/gpt-4o-mini")
    rlm.api_key = ""  # no RLM.api_key: nothing to check
    assert not keys.key_check_needs_litellm(rlm, "openai/gpt-4o-mini")
