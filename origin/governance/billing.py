"""Who pays for what: a hit's savings, a call's cost, and the budget around the call.

- A cache hit costs nothing: it counts as saved what its entry's usage would have cost
  at its model's (first target's) price.
- A miss that starts a provider call pays for the call: its reservation (when the
  project has a budget) is settled to the call's real cost when the call ends, or
  released when it fails or every client waiting for it has left. The call's tokens and
  cost are recorded under the key that started it.
- A request that joins a call already in flight (coalescing) pays nothing: it counts as
  a ``coalesced`` request of its key, and gives back the reservation it may have made
  while the call was starting.
- A stream resumed by another provider after it broke (``origin/routing/resume.py``)
  costs each provider's part at that provider's price (``origin/governance/resumed_bill.py``);
  the usage record and the budget get their sum, or keep the reservation when either
  part's price or tokens are unknown.

With no budget, a miss makes no Redis command for any of this (usage is counted in
memory, ``origin/governance/usage.py``); with one, exactly one script before the call and one after.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from prism import Budget, Envelope

from ..providers.base import UpstreamCompletion
from ..providers.config import ProviderConfig
from ..providers.pricing import Price, cost_micros
from ..providers.token_counts import Tokens, tokens_of
from .budgets import Budgets, BudgetUnavailableError, Reservation
from .resumed_bill import BillPart, Resumption, broken_part_tokens
from .usage import UsageRecorder

if TYPE_CHECKING:
    from .rate_limiter import TokenCharge

__all__ = ["Billing", "Charge", "HitCost"]


# What a hit saved (micro-dollars) and the stored answer's tokens (None: not reported).
HitCost = tuple[int, Tokens | None]


class Billing:
    def __init__(
        self,
        config: ProviderConfig,
        budgets: Budgets,
        usage: UsageRecorder,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],  # settles after the response
        available: Callable[[], bool] = lambda: True,  # the Redis breaker is closed
    ) -> None:
        self._available = available
        self._config = config
        self.budgets = budgets
        self.usage = usage
        self._spawn = spawn
        # id(envelope) -> (envelope, (what a hit on it saves, its tokens)): hot entries are
        # the same Envelope object on every hit (``RecentEntries``), so each is costed once.
        self._saved: dict[int, tuple[Envelope, HitCost]] = {}

    def hit(
        self,
        project: str,
        key_id: str,
        model: str,
        envelope: Envelope,
        now: float,
        layer: str = "redis",
    ) -> HitCost:
        """A hit (``layer``: redis or semantic; the edge's ``kv`` hits are counted from
        their records, ``saved``): nothing spent; saved what its entry cost (0 when
        unknown). Returned with the entry's tokens, for the request log (the same tuple
        for every hit on the entry)."""
        known = self._saved.get(id(envelope))
        if known is not None and known[0] is envelope:
            cost = known[1]
        else:
            tokens = tokens_of(envelope.usage)
            if len(self._saved) >= 1024:
                self._saved.clear()
            cost = (self.worth(model, tokens), tokens)
            self._saved[id(envelope)] = (envelope, cost)
        self.usage.hit(project, key_id, model, cost[0], now, layer)
        return cost

    def worth(self, model: str, tokens: Tokens | None) -> int:
        """What an answer of ``tokens`` would have cost on ``model``, in micro-dollars (0
        when its tokens or the model's price are unknown): what a hit on it saves."""
        price = self.budgets.model_prices(model)[0] if tokens is not None else None
        return cost_micros(price, tokens) if price is not None and tokens is not None else 0

    async def open(
        self,
        project: str,
        key_id: str,
        model: str,
        layer: str,
        budget: Budget | None,
        bounds: tuple[int, int] = (0, 0),
        rate_tokens: TokenCharge | None = None,
    ) -> Charge:
        """A miss's charge; with a budget, its ``bounds`` (prompt and completion tokens,
        ``origin/governance/token_bounds.py``) reserved first (raises when it does not fit).
        ``rate_tokens``: what a token rate limit admitted, settled with the charge."""
        reservation = None
        if budget is not None:
            if not self._available():  # Redis just failed: refuse now, not after a timeout
                raise BudgetUnavailableError(
                    "This project's budget cannot be checked right now; retry shortly.",
                    headers={"retry-after": "1"},
                )
            reservation = await self.budgets.reserve(project, budget, model, *bounds)
        return Charge(self, project, key_id, model, layer, reservation, rate_tokens)

    def price(self, provider: str, model: str) -> Price | None:
        return self._config.prices.price(provider, model)


class Charge:
    """One miss's bill; the flight calls it once when its provider call ends."""

    __slots__ = (
        "_billing",
        "_done",
        "cost",
        "key_id",
        "layer",
        "model",
        "parts",
        "project",
        "rate_tokens",
        "reservation",
        "served",
        "tokens",
    )

    def __init__(
        self,
        billing: Billing,
        project: str,
        key_id: str,
        model: str,
        layer: str,
        reservation: Reservation | None,
        rate_tokens: TokenCharge | None = None,
    ) -> None:
        self._billing = billing
        self.project = project
        self.key_id = key_id
        self.model = model
        self.layer = layer
        self.reservation = reservation
        self._done = False
        # Once the call ended (for the access log and the trace): what it used and cost
        # (None: not reported, or no price) and (provider, upstream model) that answered.
        self.tokens: Tokens | None = None
        self.cost: int | None = None
        self.served: tuple[str, str] | None = None
        # A resumed answer's parts, the broken one first (``served`` is the last's).
        self.parts: tuple[BillPart, ...] | None = None
        # The tokens a token rate limit admitted for the call, settled when it ends.
        self.rate_tokens = rate_tokens

    def __call__(
        self,
        result: UpstreamCompletion | None,
        provider: str,
        upstream: str,
        resumption: Resumption | None = None,
    ) -> None:
        """The call ended: ``result`` None when it failed or was abandoned; ``resumption``
        when ``provider`` continued a stream another broke."""
        if self._done:
            return
        self._done = True
        billing = self._billing
        if self.rate_tokens is not None:
            self.rate_tokens.settle(None if result is None else result.completion)
        if result is None:
            self._settle(0)
            return
        tokens = tokens_of(result.completion.get("usage"))
        if resumption is None:
            price = billing.price(provider, upstream) if tokens is not None else None
            cost = cost_micros(price, tokens) if price is not None and tokens is not None else None
        else:
            cost = self._resumed_cost(provider, upstream, resumption)
        self.tokens, self.cost, self.served = tokens, cost, (provider, upstream)
        billing.usage.record(self.project, self.key_id, self.model, self.layer, tokens, cost)
        if self.reservation is not None:
            # No usage or no price for what answered: keep what was reserved (an upper
            # bound), never less than was spent.
            self._settle(self.reservation.amount if cost is None else cost)

    def _cost(self, provider: str, upstream: str, tokens: Tokens | None) -> int | None:
        price = self._billing.price(provider, upstream) if tokens is not None else None
        return cost_micros(price, tokens) if price is not None and tokens is not None else None

    def _resumed_cost(self, provider: str, upstream: str, resumption: Resumption) -> int | None:
        """Each part at its own provider's price; None when either is unknown."""
        broken = broken_part_tokens(resumption)
        first = BillPart(
            resumption.provider,
            resumption.upstream,
            broken,
            self._cost(resumption.provider, resumption.upstream, broken),
        )
        then = resumption.continuation
        last = BillPart(provider, upstream, then, self._cost(provider, upstream, then))
        self.parts = (first, last)
        return None if first.cost is None or last.cost is None else first.cost + last.cost

    def joined(self) -> None:
        """This request joined a call already running: it pays nothing."""
        if not self._done:
            self._done = True
            if self.rate_tokens is not None:
                self.rate_tokens.settle(None)
            self._billing.usage.record(self.project, self.key_id, self.model, "coalesced")
            self._settle(0)

    def _settle(self, cost: int) -> None:
        reservation = self.reservation
        if reservation is not None:
            self._billing._spawn(self._billing.budgets.settle(reservation, cost))
