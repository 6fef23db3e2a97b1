"""Chooses the provider for a model and fails over, before the first byte, to the next one.

The seam for what comes next (health gates, hedged requests): every call goes
through ``Router``, which knows the ordered targets for a model and records
each provider's outcome and latency.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from prism import NotFoundError, PrismError, RateLimitError, UpstreamError

from .health import ProviderHealth
from .metrics import Metrics
from .providers.base import ChatProvider, UpstreamCompletion, UpstreamStream
from .providers.config import ProviderConfig

__all__ = ["Routed", "Router"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Routed(Generic[T]):
    """What a target answered, and which target it was."""

    value: T
    provider: str  # the provider's name in the configuration
    label: str  # what ``x-prism-provider`` says
    fallback: bool = False  # not the route's first target: stored only briefly


# Failures that another provider may not share; a 400 or 404 would only repeat.
_RETRYABLE = (UpstreamError, RateLimitError)


class Router:
    def __init__(
        self, config: ProviderConfig, providers: Mapping[str, ChatProvider], metrics: Metrics
    ) -> None:
        self._config = config
        self._providers = providers
        self._metrics = metrics
        self.health = {name: ProviderHealth() for name in providers}

    def _targets(self, model: str) -> list[tuple[ChatProvider, str]]:
        targets = [(self._providers[spec.name], up) for spec, up in self._config.targets(model)]
        if not targets:
            raise NotFoundError(
                f"The model '{model}' is not served by this gateway.",
                param="model",
                code="model_not_found",
            )
        return targets

    def _observe(
        self, provider: ChatProvider, started: float, error: PrismError | None = None
    ) -> None:
        seconds = time.perf_counter() - started
        outcome = "ok" if error is None else "error"
        self._metrics.provider_seconds.labels(provider.spec.name, outcome).observe(seconds)
        detail = None if error is None else f"{error.status} {error.code}"
        self.health[provider.spec.name].record(error is None, seconds, detail)

    async def _first(
        self, model: str, call: Callable[[ChatProvider, str], Awaitable[T]]
    ) -> Routed[T]:
        """The first target that answers, and who it was; the last error if none does."""
        last: PrismError | None = None
        for index, (provider, upstream_model) in enumerate(self._targets(model)):
            started = time.perf_counter()
            try:
                result = await call(provider, upstream_model)
            except _RETRYABLE as error:
                self._observe(provider, started, error)
                last = error
                continue
            self._observe(provider, started)
            spec = provider.spec
            return Routed(result, spec.name, spec.label or spec.name, fallback=index > 0)
        assert last is not None
        raise last

    async def complete(self, body: dict[str, Any], model: str) -> Routed[UpstreamCompletion]:
        """A complete answer from the model's first working target."""
        return await self._first(model, lambda provider, up: provider.complete(body, up))

    async def stream(self, body: dict[str, Any], model: str) -> Routed[UpstreamStream]:
        """A started stream; failover happens only before its first byte."""
        return await self._first(model, lambda provider, up: provider.stream(body, up))

    def stream_failed(self, routed: Routed[UpstreamStream], error: PrismError) -> None:
        """A stream that broke after it started (cut, malformed, unfinished) counts against
        its provider like a failed call."""
        self.health[routed.provider].record(False, 0.0, f"{error.status} {error.code}")
