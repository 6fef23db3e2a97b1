"""Providers and model routes as data (a TOML file, or the usual environment variables).

```toml
[providers.openai]
kind = "openai"                      # any OpenAI-compatible API
base_url = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"

[providers.groq]
kind = "openai"
base_url = "https://api.groq.com/openai/v1"
api_key_env = "GROQ_API_KEY"

[providers.anthropic]
kind = "anthropic"
base_url = "https://api.anthropic.com"
api_key_env = "ANTHROPIC_API_KEY"

[providers.vllm]
kind = "openai"
base_url = "http://vllm.internal:8000/v1"
continuation = "continue_final_message"  # or "prefix": how it continues a partial answer

[models]                             # public name -> ordered targets ("provider[:upstream model]")
"fast" = ["groq:llama-3.1-8b-instant", "openai:gpt-4o-mini"]
"claude-*" = ["anthropic"]           # glob: the requested name passes through
"*" = ["openai"]

[models."gpt-4o-mini"]               # a route with options: a table instead of a list
targets = ["openai:gpt-4o-mini", "groq:llama-3.1-8b-instant"]
context_fallback = "openai:gpt-4.1-mini"  # tried once on context_length_exceeded
hedge_delay = 1.5                    # fixed hedge delay for this route (else per provider)
max_attempts = 3                     # upstream calls per request, retries and hedges included
resume = true                        # a stream broken mid-answer is continued by the next target
resume_store = false                 # cache such a spliced answer too

[providers.groq.prices]              # USD per million tokens, over origin/providers/prices.toml
"llama-3.1-8b-instant" = { input = 0.05, output = 0.08 }
"*" = { input = 1.0, output = 3.0 }  # this provider's fallback for unlisted models
```

Per provider, the routing policy: ``retries`` (1), ``retry_backoff`` (0.1 s),
``max_retry_after`` (5 s), ``first_token_timeout`` (= ``first_byte_timeout``),
``hedge`` (true), ``hedge_delay`` (adaptive), ``hedge_percentile`` (95) and, for an
OpenAI-compatible kind, ``continuation`` (none; see ``origin.routing.resume``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import ProviderSpec
from .pricing import Price, PriceTable, default_prices, parse_prices
from .registry import ADAPTERS

__all__ = [
    "CONTINUATIONS",
    "DEFAULT_MAX_ATTEMPTS",
    "ModelRoute",
    "ModelTarget",
    "ProviderConfig",
    "load_provider_config",
]

DEFAULT_MAX_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class ModelTarget:
    provider: str
    model: str | None  # None: send the requested model name unchanged


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """A public model's ordered targets and how to route between them."""

    targets: tuple[ModelTarget, ...]
    context_fallback: ModelTarget | None = None  # on context_length_exceeded, tried once
    hedge: bool = True
    hedge_delay: float | None = None  # overrides the providers' own
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    resume: bool = True  # a stream broken mid-answer is continued by another target
    resume_store: bool = False  # such a spliced answer may be cached


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    providers: dict[str, ProviderSpec]
    routes: dict[str, ModelRoute] = field(default_factory=dict)
    prices: PriceTable = field(default_factory=default_prices, compare=False)

    def route(self, model: str) -> ModelRoute | None:
        """The route for a public model name (exact, else the first matching glob). Not
        memoized: the router remembers each model's plan."""
        route = self.routes.get(model)
        if route is None:
            for pattern, candidate in self.routes.items():
                if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(model, pattern):
                    return candidate
        return route

    def targets(self, model: str) -> tuple[tuple[ProviderSpec, str], ...]:
        """Ordered (provider, upstream model) pairs for a public model name; empty if none."""
        route = self.route(model)
        if route is None:
            return ()
        return tuple((self.providers[t.provider], t.model or model) for t in route.targets)

    def model_prices(self, model: str) -> tuple[Price | None, Price | None]:
        """For a public model name: the price of its first target (what a cache hit saved)
        and the most each token kind costs at any target it may reach (what a budget
        reserves on); each None when a target it needs has no price. Not memoized."""
        route = self.route(model)
        if route is None or not route.targets:
            return None, None
        targets = list(route.targets)
        if route.context_fallback is not None:
            targets.append(route.context_fallback)
        prices = [self.prices.price(t.provider, t.model or model) for t in targets]
        if any(p is None for p in prices):
            return prices[0], None
        known = [p for p in prices if p is not None]
        most = Price(
            input=max(p.input for p in known),
            output=max(p.output for p in known),
            cached_input=max(p.cached_input for p in known),
            cache_write=max(p.cache_write for p in known),
        )
        return known[0], most


# The keys every kind reads; a provider table's other keys are its kind's own options.
_COMMON_KEYS = frozenset(
    {
        "kind",
        "base_url",
        "api_key",
        "api_key_env",
        "headers",
        "label",
        "prices",
        "connect_timeout",
        "first_byte_timeout",
        "total_timeout",
        "first_token_timeout",
        "retries",
        "retry_backoff",
        "max_retry_after",
        "hedge",
        "hedge_delay",
        "hedge_percentile",
        "continuation",
    }
)

# How an OpenAI-compatible provider may be asked to continue a partial answer.
CONTINUATIONS = ("continue_final_message", "prefix")


# Where a kind's API is when the providers file names no base_url ({key}: the table's key).
_DEFAULT_BASE_URLS = {"bedrock": "https://bedrock-runtime.{region}.amazonaws.com"}


def _spec(name: str, table: Mapping[str, Any], env: Mapping[str, str]) -> ProviderSpec:
    kind = table.get("kind", "openai")
    if kind not in ADAPTERS:
        raise ValueError(f"provider '{name}': kind must be one of {', '.join(ADAPTERS)}")
    base_url = table.get("base_url")
    if base_url is None and kind in _DEFAULT_BASE_URLS:
        with contextlib.suppress(KeyError):  # without the key it needs, base_url is required
            base_url = _DEFAULT_BASE_URLS[kind].format_map(table)
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"provider '{name}': base_url must be an http(s) URL")
    key_env = table.get("api_key_env")
    api_key = env.get(key_env) if isinstance(key_env, str) else table.get("api_key")
    headers = table.get("headers", {})
    if not isinstance(headers, dict):
        raise ValueError(f"provider '{name}': headers must be a table")
    return ProviderSpec(
        name=name,
        kind=kind,
        base_url=base_url,
        api_key=api_key or None,
        api_key_env=key_env if isinstance(key_env, str) else None,
        headers={str(k): str(v) for k, v in headers.items()},
        label=table.get("label"),
        connect_timeout=float(table.get("connect_timeout", 5.0)),
        first_byte_timeout=float(table.get("first_byte_timeout", 60.0)),
        total_timeout=float(table.get("total_timeout", 600.0)),
        first_token_timeout=_optional_seconds(name, table, "first_token_timeout"),
        retries=_count(name, table, "retries", 1),
        retry_backoff=_seconds(name, table, "retry_backoff", 0.1),
        max_retry_after=_seconds(name, table, "max_retry_after", 5.0),
        hedge=_flag(name, table, "hedge"),
        hedge_delay=_optional_seconds(name, table, "hedge_delay"),
        hedge_percentile=_percentile(name, table),
        continuation=_continuation(name, kind, table),
        options={key: value for key, value in table.items() if key not in _COMMON_KEYS},
    )


def _continuation(name: str, kind: str, table: Mapping[str, Any]) -> str | None:
    value = table.get("continuation")
    if value is None:
        return None
    if kind != "openai":
        raise ValueError(f"provider '{name}': continuation is for kind = \"openai\" providers")
    if value not in CONTINUATIONS:
        raise ValueError(
            f"provider '{name}': continuation must be one of {', '.join(CONTINUATIONS)}"
        )
    return str(value)


def _seconds(where: str, table: Mapping[str, Any], key: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"'{where}': {key} must be a number of seconds >= 0")
    return float(value)


def _flag(where: str, table: Mapping[str, Any], key: str, default: bool = True) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"'{where}': {key} must be true or false")
    return value


def _optional_seconds(where: str, table: Mapping[str, Any], key: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"'{where}': {key} must be a positive number of seconds")
    return float(value)


def _count(where: str, table: Mapping[str, Any], key: str, default: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"'{where}': {key} must be a whole number >= 0")
    return value


def _percentile(where: str, table: Mapping[str, Any]) -> float:
    value = table.get("hedge_percentile", 95.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 100:
        raise ValueError(f"'{where}': hedge_percentile must be in (0, 100]")
    return float(value)


def _target(model: str, entry: Any, providers: Mapping[str, ProviderSpec]) -> ModelTarget:
    provider, _, upstream = str(entry).partition(":")
    if provider not in providers:
        raise ValueError(f"model '{model}': unknown provider '{provider}'")
    return ModelTarget(provider, upstream or None)


def _route(model: str, entries: Any, providers: Mapping[str, ProviderSpec]) -> ModelRoute:
    options: Mapping[str, Any] = {}
    if isinstance(entries, dict):
        options = entries
        unknown = set(options) - {
            "targets",
            "context_fallback",
            "hedge",
            "hedge_delay",
            "max_attempts",
            "resume",
            "resume_store",
        }
        if unknown:
            raise ValueError(f"model '{model}': unknown keys {', '.join(sorted(unknown))}")
        entries = options.get("targets")
    if isinstance(entries, str):
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"model '{model}': give a list of 'provider[:model]' targets")
    fallback = options.get("context_fallback")
    max_attempts = _count(model, options, "max_attempts", DEFAULT_MAX_ATTEMPTS)
    if max_attempts < 1:
        raise ValueError(f"'{model}': max_attempts must be at least 1")
    return ModelRoute(
        targets=tuple(_target(model, entry, providers) for entry in entries),
        context_fallback=None if fallback is None else _target(model, fallback, providers),
        hedge=_flag(model, options, "hedge"),
        hedge_delay=_optional_seconds(model, options, "hedge_delay"),
        max_attempts=max_attempts,
        resume=_flag(model, options, "resume"),
        resume_store=_flag(model, options, "resume_store", default=False),
    )


def _from_env(env: Mapping[str, str]) -> ProviderConfig:
    providers: dict[str, ProviderSpec] = {}
    routes: dict[str, ModelRoute] = {}
    if env.get("ANTHROPIC_API_KEY"):
        providers["anthropic"] = ProviderSpec(
            name="anthropic",
            kind="anthropic",
            base_url=env.get("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
            api_key=env["ANTHROPIC_API_KEY"],
            api_key_env="ANTHROPIC_API_KEY",
        )
        routes["claude-*"] = ModelRoute((ModelTarget("anthropic", None),))
    if env.get("OPENAI_API_KEY") or env.get("OPENAI_BASE_URL"):
        providers["openai"] = ProviderSpec(
            name="openai",
            kind="openai",
            base_url=env.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
            api_key=env.get("OPENAI_API_KEY") or None,
            api_key_env="OPENAI_API_KEY",
            label=env.get("PRISM_OPENAI_LABEL") or None,
        )
        routes["*"] = ModelRoute((ModelTarget("openai", None),))
    return ProviderConfig(providers=providers, routes=routes)


def load_provider_config(path: Path | None, env: Mapping[str, str]) -> ProviderConfig:
    """From the TOML file when given, else from ``OPENAI_*`` / ``ANTHROPIC_*`` variables."""
    if path is None:
        return _from_env(env)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"providers file {path}: {error}") from None
    tables = data.get("providers", {})
    if not isinstance(tables, dict) or not tables:
        raise ValueError(f"providers file {path}: no [providers.NAME] tables")
    providers = {name: _spec(name, table, env) for name, table in tables.items()}
    models = data.get("models", {})
    routes = {model: _route(model, entries, providers) for model, entries in models.items()}
    overrides: dict[str, dict[str, Price]] = {}
    for name, table in tables.items():
        if isinstance(table, dict) and "prices" in table:
            overrides[name] = parse_prices(f"provider '{name}': prices", table["prices"])
    prices = default_prices()
    return ProviderConfig(
        providers=providers,
        routes=routes,
        prices=prices.with_overrides(overrides) if overrides else prices,
    )
