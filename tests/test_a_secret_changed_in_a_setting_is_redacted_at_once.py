"""The redactor a call uses is kept between calls (building one reads the whole
environment), yet a secret that a setting takes, by assignment or changed in place in a
dict, or the environment, is removed from the very next call's messages."""

from __future__ import annotations

import pytest

from rlm_magic import RLM

NEW = "sk-new-secret-0123456789abcdef"


def _set_api_key(rlm, monkeypatch):
    rlm.client.config.api_key = NEW


def _in_place_kwargs_header(rlm, monkeypatch):
    rlm.client.config.litellm_kwargs["extra_headers"]["x-api-key"] = NEW


def _in_place_model_list(rlm, monkeypatch):
    rlm.client.config.model_list[0]["litellm_params"]["api_key"] = NEW


def _in_place_router_settings(rlm, monkeypatch):
    rlm.client.config.router_settings["api_key"] = NEW


def _environment(rlm, monkeypatch):
    monkeypatch.setenv("SOME_SERVICE_API_KEY", NEW)


def _environment_reference(rlm, monkeypatch):
    monkeypatch.setenv("REFERRED_KEY", NEW)
    rlm.client.config.litellm_kwargs["extra_headers"]["authorization"] = "os.environ/REFERRED_KEY"


@pytest.mark.parametrize(
    "change",
    [
        _set_api_key,
        _in_place_kwargs_header,
        _in_place_model_list,
        _in_place_router_settings,
        _environment,
        _environment_reference,
    ],
)
def test_a_new_secret_is_redacted_by_the_next_calls_redactor(change, monkeypatch):
    rlm = RLM(
        model="openai/m",
        api_base="http://127.0.0.1:9/v1",
        api_key="sk-old-secret-0123456789abcdef",
        litellm_kwargs={"extra_headers": {"x-api-key": "old-header-value-0123456789"}},
        model_list=[{"model_name": "m", "litellm_params": {"model": "openai/m", "api_key": "x"}}],
        router_settings={},
        progress=False,
    )
    text = f"the key is {NEW} here"
    first = rlm.client.redactor()
    assert rlm.client.redactor() is first  # kept while nothing changed
    assert NEW in first(text)
    change(rlm, monkeypatch)
    assert NEW not in rlm.client.redactor()(text)
