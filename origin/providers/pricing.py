"""What a call costs: the price table (``origin/providers/prices.toml``, overridable per provider
and
model in the providers file) and the cost of a reported usage, in integer micro-USD.

A price is USD per million tokens, which is micro-USD per token, so a cost is a sum of
token counts times prices, rounded to the nearest micro-dollar once per request.

Usage conventions (both end up here in OpenAI's form, which the origin serves):

- OpenAI: ``prompt_tokens`` includes the cached ones (``prompt_tokens_details.
  cached_tokens``), billed at ``cached_input``; the rest at ``input``.
- Anthropic reports ``input_tokens`` (uncached), ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens`` apart. ``origin/providers/anthropic_answer.py`` folds
  them into ``prompt_tokens`` and reports the reads as ``cached_tokens`` and the writes as
  ``cache_creation_tokens`` (both in ``prompt_tokens_details``), so cost is
  uncached x ``input`` + reads x ``cached_input`` + writes x ``cache_write``. A usage
  still in Anthropic's own form is read as such.

A model with no price (nothing in the table or the overrides matches) has an unknown
cost: usage counts its tokens and requests as ``unpriced``, and a project with a budget
is refused it (``origin/governance/budgets.py``) unless a fallback price is configured (``"*"``).
"""

from __future__ import annotations

import fnmatch
import functools
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .token_counts import Tokens

__all__ = [
    "Price",
    "PriceTable",
    "cost_micros",
    "default_prices",
    "parse_prices",
]

_PRICE_FIELDS = ("input", "cached_input", "cache_write", "output")
_GLOB = frozenset("*?[")
# A model's dated or moving version: name-2024-07-18, name-20241022, name-0613, name-latest.
_DATED = re.compile(r"(.+?)-(?:latest|\d{4}-\d{2}-\d{2}|\d{8}|\d{4})")


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens (= micro-USD per token)."""

    input: float
    output: float
    cached_input: float
    cache_write: float

    @property
    def max_input(self) -> float:
        """The most any prompt token can cost: what a reservation counts on."""
        return max(self.input, self.cached_input, self.cache_write)


def cost_micros(price: Price, tokens: Tokens) -> int:
    """The cost of ``tokens`` at ``price``, in micro-USD (to the nearest one)."""
    cached = min(tokens.cached, tokens.prompt)
    written = min(tokens.cache_write, tokens.prompt - cached)
    uncached = tokens.prompt - cached - written
    micros = (
        uncached * price.input
        + cached * price.cached_input
        + written * price.cache_write
        + tokens.completion * price.output
    )
    return math.floor(micros + 0.5)


def _number(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise ValueError(f"{where}: {key} must be a number of USD per million tokens >= 0")
    return float(value)


def parse_price(where: str, table: Any) -> Price:
    """A price from its table; ``ValueError`` naming ``where`` and the field."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: must be a table with input and output (USD per 1M tokens)")
    unknown = set(table) - set(_PRICE_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
    for required in ("input", "output"):
        if required not in table:
            raise ValueError(f"{where}: {required} is required (USD per million tokens)")
    base = _number(where, "input", table["input"])
    return Price(
        input=base,
        output=_number(where, "output", table["output"]),
        cached_input=_number(where, "cached_input", table.get("cached_input", base)),
        cache_write=_number(where, "cache_write", table.get("cache_write", base)),
    )


def parse_prices(where: str, tables: Any) -> dict[str, Price]:
    """``{model name or glob: price}`` from a TOML table of tables."""
    if not isinstance(tables, dict):
        raise ValueError(f"{where}: must be a table of model prices")
    return {str(model): parse_price(f"{where}.{model}", t) for model, t in tables.items()}


def _lookup(prices: Mapping[str, Price], model: str) -> Price | None:
    """Exact name; else the name of which ``model`` is a dated version (``gpt-4o-mini`` for
    ``gpt-4o-mini-2024-07-18``, ``claude-3-5-haiku`` for ``-latest``); else the first
    matching glob. Another suffix is another model (``o1-pro`` is not ``o1``): unpriced."""
    found = prices.get(model)
    if found is not None:
        return found
    dated = _DATED.fullmatch(model)
    if dated is not None:
        found = prices.get(dated.group(1))
        if found is not None:
            return found
    for name, price in prices.items():
        if _GLOB.intersection(name) and fnmatch.fnmatchcase(model, name):
            return price
    return None


class PriceTable:
    """The built-in table, and per-provider overrides that win over it."""

    def __init__(
        self,
        models: Mapping[str, Price],
        overrides: Mapping[str, Mapping[str, Price]] | None = None,
    ) -> None:
        self._models = dict(models)
        self._overrides = {p: dict(t) for p, t in (overrides or {}).items()}
        self._memo: dict[tuple[str, str], Price | None] = {}

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Price]]) -> PriceTable:
        return PriceTable(self._models, overrides)

    def price(self, provider: str, model: str) -> Price | None:
        """The price of ``model`` at ``provider``; None: unknown. Remembered (bounded)."""
        key = (provider, model)
        if key in self._memo:
            return self._memo[key]
        override = self._overrides.get(provider)
        found = _lookup(override, model) if override else None
        if found is None:
            found = _lookup(self._models, model)
        if len(self._memo) >= 4096:
            self._memo.clear()
        self._memo[key] = found
        return found


@functools.cache
def default_prices() -> PriceTable:
    """The table shipped with the origin (``origin/providers/prices.toml``), read once."""
    text = resources.files("origin.providers").joinpath("prices.toml").read_text()
    data = tomllib.loads(text)
    return PriceTable(parse_prices("prices.toml models", data.get("models", {})))
