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

[models]                             # public name -> ordered targets ("provider[:upstream model]")
"fast" = ["groq:llama-3.1-8b-instant", "openai:gpt-4o-mini"]
"claude-*" = ["anthropic"]           # glob: the requested name passes through
"*" = ["openai"]
```
"""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import ProviderSpec

__all__ = ["ModelTarget", "ProviderConfig", "load_provider_config"]

_KINDS = ("openai", "anthropic")


@dataclass(frozen=True, slots=True)
class ModelTarget:
    provider: str
    model: str | None  # None: send the requested model name unchanged


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    providers: dict[str, ProviderSpec]
    routes: dict[str, tuple[ModelTarget, ...]] = field(default_factory=dict)

    def targets(self, model: str) -> tuple[tuple[ProviderSpec, str], ...]:
        """Ordered (provider, upstream model) pairs for a public model name; empty if none."""
        route = self.routes.get(model)
        if route is None:
            for pattern, candidate in self.routes.items():
                if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(model, pattern):
                    route = candidate
                    break
        if not route:
            return ()
        return tuple((self.providers[t.provider], t.model or model) for t in route)

    def public_models(self) -> list[str]:
        return sorted(name for name in self.routes if not any(c in name for c in "*?["))


def _spec(name: str, table: Mapping[str, Any], env: Mapping[str, str]) -> ProviderSpec:
    kind = table.get("kind", "openai")
    if kind not in _KINDS:
        raise ValueError(f"provider '{name}': kind must be one of {', '.join(_KINDS)}")
    base_url = table.get("base_url")
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
    )


def _route(
    model: str, entries: Any, providers: Mapping[str, ProviderSpec]
) -> tuple[ModelTarget, ...]:
    if isinstance(entries, str):
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"model '{model}': give a list of 'provider[:model]' targets")
    targets = []
    for entry in entries:
        provider, _, upstream = str(entry).partition(":")
        if provider not in providers:
            raise ValueError(f"model '{model}': unknown provider '{provider}'")
        targets.append(ModelTarget(provider, upstream or None))
    return tuple(targets)


def _from_env(env: Mapping[str, str]) -> ProviderConfig:
    providers: dict[str, ProviderSpec] = {}
    routes: dict[str, tuple[ModelTarget, ...]] = {}
    if env.get("ANTHROPIC_API_KEY"):
        providers["anthropic"] = ProviderSpec(
            name="anthropic",
            kind="anthropic",
            base_url=env.get("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
            api_key=env["ANTHROPIC_API_KEY"],
            api_key_env="ANTHROPIC_API_KEY",
        )
        routes["claude-*"] = (ModelTarget("anthropic", None),)
    if env.get("OPENAI_API_KEY") or env.get("OPENAI_BASE_URL"):
        providers["openai"] = ProviderSpec(
            name="openai",
            kind="openai",
            base_url=env.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
            api_key=env.get("OPENAI_API_KEY") or None,
            api_key_env="OPENAI_API_KEY",
            label=env.get("PRISM_OPENAI_LABEL") or None,
        )
        routes["*"] = (ModelTarget("openai", None),)
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
    return ProviderConfig(providers=providers, routes=routes)
