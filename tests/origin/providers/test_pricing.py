"""Prices as data and cost by each provider's usage convention, in integer micro-USD."""

from __future__ import annotations

from pathlib import Path

import pytest

from origin.providers.anthropic_answer import to_chat_completion
from origin.providers.config import load_provider_config
from origin.providers.pricing import Price, cost_micros, default_prices
from origin.providers.token_counts import Tokens, tokens_of
from origin.settings import Settings, SettingsError

MINI = Price(input=0.15, output=0.60, cached_input=0.075, cache_write=0.15)
SONNET = Price(input=3.0, output=15.0, cached_input=0.30, cache_write=3.75)


def counted(usage: object) -> Tokens:
    """``tokens_of(usage)``, which finds the counts."""
    tokens = tokens_of(usage)
    assert tokens is not None, usage
    return tokens


def test_the_table_prices_the_models_the_docs_and_routes_name() -> None:
    table = default_prices()
    for model in (
        "gpt-4o-mini", "gpt-4o", "gpt-4.1-mini", "llama-3.1-8b-instant",
        "claude-3-5-haiku-latest", "claude-sonnet-4-5", "prism-local-echo",
    ):  # fmt: skip
        assert table.price("any", model) is not None, model
    assert table.price("openai", "gpt-4o-mini") == MINI
    # Dated versions take their name's price; another suffix is another model.
    assert table.price("openai", "gpt-4o-mini-2024-07-18") == MINI
    assert table.price("openai", "gpt-4o-2024-08-06") == table.price("openai", "gpt-4o")
    assert table.price("anthropic", "claude-sonnet-4-5-20250929") == SONNET
    assert table.price("openai", "gpt-4o-minix") is None  # not a version of gpt-4o-mini
    # Embedding models: input only.
    small = table.price("openai", "text-embedding-3-small")
    assert small is not None and (small.input, small.output) == (0.02, 0)
    large = table.price("openai", "text-embedding-3-large")
    assert large is not None and (large.input, large.output) == (0.13, 0)
    assert table.price("openai", "o1-pro") is None  # another model, not o1
    assert table.price("openai", "mystery") is None


def test_openai_counts_cached_tokens_inside_prompt_tokens() -> None:
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 200,
        "prompt_tokens_details": {"cached_tokens": 800},
    }
    # 200 uncached x 0.15 + 800 cached x 0.075 + 200 out x 0.60 = 30 + 60 + 120
    assert cost_micros(MINI, counted(usage)) == 210
    assert cost_micros(MINI, counted({"prompt_tokens": 3, "completion_tokens": 1})) == 1
    assert tokens_of(None) is None and tokens_of({"foo": 1}) is None


def test_anthropic_cache_reads_and_writes_cost_the_same_raw_or_translated() -> None:
    raw = {
        "input_tokens": 100,
        "cache_read_input_tokens": 10_000,
        "cache_creation_input_tokens": 2_000,
        "output_tokens": 500,
    }
    # 100 x 3 + 10,000 x 0.30 + 2,000 x 3.75 + 500 x 15 = 300 + 3,000 + 7,500 + 7,500
    expected = 18_300
    assert cost_micros(SONNET, counted(raw)) == expected
    message = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn", "usage": raw,
    }  # fmt: skip
    translated = to_chat_completion(message, "claude-sonnet-4-5", created=0)["usage"]
    assert translated["prompt_tokens"] == 12_100
    assert cost_micros(SONNET, counted(translated)) == expected


def test_the_providers_file_overrides_prices_per_provider(tmp_path: Path) -> None:
    config = tmp_path / "providers.toml"
    config.write_text(
        '[providers.a]\nbase_url = "http://a/v1"\n'
        '[providers.a.prices]\n"gpt-4o-mini" = { input = 1, output = 2 }\n'
        '"*" = { input = 5, cached_input = 1, output = 9 }\n'
        '[providers.b]\nbase_url = "http://b/v1"\n'
        '[models]\n"gpt-4o-mini" = ["a", "b"]\n"fast" = ["b:gpt-4o"]\n"odd" = ["b"]\n'
    )
    loaded = load_provider_config(config, {})
    prices = loaded.prices
    assert prices.price("a", "gpt-4o-mini") == Price(1.0, 2.0, 1.0, 1.0)
    assert prices.price("a", "anything-else") == Price(5.0, 9.0, 1.0, 5.0)  # a's fallback
    assert prices.price("b", "gpt-4o-mini") == MINI  # b keeps the table's
    # A hit saves at the first target's price; a budget reserves on the dearest of any.
    assert loaded.model_prices("gpt-4o-mini") == (
        Price(1.0, 2.0, 1.0, 1.0),
        Price(1.0, 2.0, 1.0, 1.0),
    )
    assert loaded.model_prices("fast")[1] == default_prices().price("b", "gpt-4o")
    assert loaded.model_prices("odd") == (None, None)  # b has no price for "odd"
    assert loaded.model_prices("unrouted") == (None, None)


@pytest.mark.parametrize(
    ("prices", "message"),
    [
        ('"m" = { input = 1 }', "provider 'a': prices.m: output is required"),
        ('"m" = { input = -1, output = 1 }', "prices.m: input must be a number of USD per million"),
        ('"m" = { input = "1", output = 1 }', "prices.m: input must be a number"),
        ('"m" = { input = 1, output = 1, outptu = 2 }', "prices.m: unknown keys outptu"),
        ('"m" = 3', "prices.m: must be a table with input and output"),
    ],
)
def test_a_bad_price_is_a_settings_error_naming_it(
    tmp_path: Path, prices: str, message: str
) -> None:
    config = tmp_path / "providers.toml"
    config.write_text(f'[providers.a]\nbase_url = "http://a/v1"\n[providers.a.prices]\n{prices}\n')
    env = {
        "PRISM_KEY_SECRET": "test-key-secret-0123456789abcdef",
        "PRISM_FORWARD_SECRET": "test-forward-secret-0123456789ab",
        "PRISM_PROVIDERS_FILE": str(config),
    }
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        Settings.from_env(env)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PRISM_BUDGET_HOLD_SECONDS", "5", "PRISM_BUDGET_HOLD_SECONDS must be at least 60"),
        ("PRISM_BUDGET_HOLD_SECONDS", "soon", "PRISM_BUDGET_HOLD_SECONDS must be a number"),
        ("PRISM_USAGE_FLUSH_INTERVAL", "0", "PRISM_USAGE_FLUSH_INTERVAL must be 0.05 to 60"),
        ("PRISM_USAGE_FLUSH_INTERVAL", "600", "PRISM_USAGE_FLUSH_INTERVAL must be 0.05 to 60"),
    ],
)
def test_bad_budget_and_usage_settings_are_refused(name: str, value: str, message: str) -> None:
    env = {
        "PRISM_KEY_SECRET": "test-key-secret-0123456789abcdef",
        "PRISM_FORWARD_SECRET": "test-forward-secret-0123456789ab",
        name: value,
    }
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)
