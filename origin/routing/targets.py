"""What the router routes between: a provider:model target, a resolved route, an answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..providers.base import ChatProvider, ProviderSpec
from .health import Admission, Health
from .hedge import HedgeBudget
from .stall_watch import Pace

__all__ = ["Plan", "Routed", "Target"]

T = TypeVar("T")


@dataclass(slots=True)  # not frozen: made on every miss, and frozen fields cost a call each
class Routed(Generic[T]):
    """What a target answered, and which target it was (never changed once made)."""

    value: T
    provider: str  # the provider's name in the configuration
    label: str  # what ``x-prism-provider`` says
    fallback: bool = False  # not the route's first target: stored only briefly
    model: str = ""  # the upstream model that answered
    attempts: int = 1  # upstream calls made for this answer (retries and hedges included)
    hedged: bool = False  # a hedge was started


class Target:
    """One provider:model pair: its health (and its provider's), its hedge budget, its
    labelled counters. Made once per pair, shared by every route that names it."""

    __slots__ = (
        "counters",
        "health",
        "hedges",
        "label",
        "model",
        "name",
        "pace",
        "provider",
        "provider_health",
        "spec",
    )

    def __init__(
        self, provider: ChatProvider, model: str, health: Health, provider_health: Health
    ) -> None:
        self.provider = provider
        self.spec: ProviderSpec = provider.spec
        self.name = provider.spec.name
        self.label = provider.spec.label or provider.spec.name
        self.model = model
        self.health = health
        self.provider_health = provider_health
        self.hedges = HedgeBudget()
        self.pace = Pace()  # its streams' silences: when one of them has stalled
        self.counters: dict[str, Any] = {}

    def admission(self, now: float) -> int:
        """The stricter of the provider's gate and this target's (an ``Admission``)."""
        provider, own = self.provider_health, self.health
        if provider.healthy and own.healthy:
            return Admission.OPEN
        return max(provider.admission(now), own.admission(now))


@dataclass(frozen=True, slots=True)
class Plan:
    """A public model's route, resolved to targets once."""

    targets: tuple[Target, ...]
    first_tries: tuple[tuple[Target, float], ...]  # (target, delay): a request's starting queue
    context_fallback: Target | None
    hedge: bool
    hedge_delay: float | None
    max_attempts: int
    resume: bool = True  # a broken stream may be continued by another target
    resume_store: bool = False  # and the spliced answer cached
