"""What an OpenAI-compatible endpoint's calls read without importing litellm (its
bundled price map, its routes, its finish reasons) is what litellm itself says."""

from __future__ import annotations

import pytest

from rlm_magic.llm import price_map, pricing
from rlm_magic.llm.transports.wire import light_route, parsing, route_for

MODELS = [
    "gpt-4o-mini",
    "openai/gpt-4o-mini",
    "openai/gpt-4o",
    "openai/gpt-4.1-mini",
    "openai/gpt-3.5-turbo",
    "hosted_vllm/some-model",
    "openai/sub-model",
    "openai/root-model",
]


def not_imported(monkeypatch) -> None:
    """As in a process where litellm was never imported."""
    import sys

    from rlm_magic.llm import litellm_loader

    monkeypatch.delitem(sys.modules, "litellm")
    monkeypatch.setattr(litellm_loader, "_litellm", None)


@pytest.fixture
def bundled_only(monkeypatch, litellm_imported):
    """Prices read from the bundled file, as in a process that never imported litellm."""
    monkeypatch.setattr(price_map, "model_cost", price_map.bundled)
    return litellm_imported


def test_the_bundled_map_is_litellms_map(litellm_imported):
    bundled = price_map.bundled()
    # (litellm's map may also hold models registered since, e.g. the demo's, and keys
    # litellm adds to an entry as it reads it, e.g. a Router's "supported_openai_params")
    prices = litellm_imported.model_cost
    differ = [
        name
        for name, entry in bundled.items()
        if any(value != (prices.get(name) or {}).get(key) for key, value in entry.items())
    ]
    assert differ == []


@pytest.mark.parametrize("model", MODELS)
def test_a_price_from_the_file_is_litellms_price(bundled_only, model):
    litellm = bundled_only
    route = light_route(model, "http://127.0.0.1:9/v1", "sk-test") if "/" in model else None
    names = route.price_names if route else price_map.names_of(model)
    for usage in [(10, 5, 0), (1234, 567, 0), (2000, 100, 1024)]:
        ours = pricing.cost_of_usage(None, names, usage[0], usage[1], usage[2], 0, None)
        try:
            prompt, completion = litellm.cost_per_token(
                model=model,
                prompt_tokens=usage[0],
                completion_tokens=usage[1],
                cache_read_input_tokens=usage[2],
            )
            theirs = prompt + completion
        except Exception:  # noqa: BLE001 - litellm prices no such model
            theirs = None
        if theirs is None:
            assert ours is None
        else:
            assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    ("model", "api_base"),
    [
        ("openai/x", "http://127.0.0.1:9/v1"),
        ("openai/gpt-4o-mini", "http://127.0.0.1:9/v1"),
        ("openai/meta/llama-3", "https://api.together.xyz/v1"),
        ("hosted_vllm/x", "http://127.0.0.1:9"),
        ("litellm_proxy/y", "http://127.0.0.1:9"),
        ("openai/gpt-4o-mini", None),
    ],
)
def test_a_route_decided_without_litellm_is_litellms_route(
    litellm_imported, monkeypatch, model, api_base
):
    theirs = route_for(litellm_imported, model, api_base, "sk-test")
    not_imported(monkeypatch)  # (light_route decides only then)
    ours = light_route(model, api_base, "sk-test")
    assert ours == theirs


@pytest.mark.parametrize("model", ["openai/o3-mini", "openai/gpt-5", "openai/gpt-4o-audio-preview"])
def test_models_litellm_rewrites_are_left_to_it(litellm_imported, monkeypatch, model):
    not_imported(monkeypatch)
    assert light_route(model, "http://127.0.0.1:9/v1", "sk-test") is None


def test_the_finish_reasons_are_litellms(litellm_imported):
    from litellm.litellm_core_utils.core_helpers import _FINISH_REASON_MAP

    assert parsing._LITELLM_FINISH == dict(_FINISH_REASON_MAP)


def test_a_window_from_the_price_map_is_litellms(litellm_imported):
    from rlm_magic.llm import profiles, windows

    profiles.forget()
    try:
        windows.look_up_in_price_map(["openai/gpt-4o-mini", "openai/sub-model"])
        assert (
            windows.input_window(None, "openai/gpt-4o-mini", None, None)
            == (litellm_imported.get_model_info("openai/gpt-4o-mini")["max_input_tokens"])
        )
        assert windows.input_window(None, "openai/sub-model", None, None) is None
    finally:
        profiles.forget()


def test_a_tiered_price_litellm_cannot_reckon_is_recorded_at_its_highest_rates(
    litellm_imported, monkeypatch
):
    # A priced model is never recorded as unpriced ($0, a budget that never fills):
    # when litellm's tier reckoning fails, the highest tier's rates count.
    def refuses(**_: object) -> tuple[float, float]:
        raise ValueError("model not mapped")

    monkeypatch.setattr(litellm_imported, "cost_per_token", refuses)
    names = ("openai/gemini-2.5-pro", "gemini-2.5-pro")
    entry = litellm_imported.model_cost["gemini-2.5-pro"]
    cost = pricing.cost_of_usage(litellm_imported, names, 1000, 1000, 0, 0, None)
    assert cost == pytest.approx(
        1000 * entry["input_cost_per_token_above_200k_tokens"]
        + 1000 * entry["output_cost_per_token_above_200k_tokens"]
    )
