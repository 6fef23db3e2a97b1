"""Atomic spending budgets per project and UTC period, held in Redis.

Before a provider is called for a project with a budget, the most the request can cost
(its prompt bound x the highest input price of any target its model can reach + its
completion bound x the highest output price; each API's bounds are in
``origin/governance/token_bounds.py``) is reserved by ONE script that checks the limit and reserves
atomically, so any number of origin processes admit exactly as much as the budget
allows. The answer settles it (the reservation goes, the real cost is added); a failed
or abandoned call releases it.

Redis, per project and period (``day`` = ``2026-12-01``, ``month`` = ``2026-12``)::

    prism:budget:<project>:<period>        hash   spent, reserved (integer micro-USD)
    prism:budget:<project>:<period>:held   zset   one member per live reservation,
                                                  "<id>:<micro-USD>", scored by its deadline

Both expire a day after the period ends. Crash bound: a process that dies holding a
reservation cannot settle it; the next reservation of the project finds its deadline
passed (``hold`` seconds, default 900, longer than a provider call may take) and frees
it. So a crash holds back at most its in-flight reservations, for at most ``hold``.
A settle that comes after its reservation was freed still adds the real cost.
"""

from __future__ import annotations

import itertools
import math
import secrets
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from prism import Budget, PermissionDeniedError, PrismError, RateLimitError

from ..connection.redis_client import LoadedScript, RedisClient, RedisClientError
from ..providers.pricing import Price

if TYPE_CHECKING:  # the config's module loads every adapter: not for the CLI's usage report
    from ..providers.config import ProviderConfig

__all__ = [
    "RELEASE_SCRIPT",
    "RESERVE_SCRIPT",
    "BudgetUnavailableError",
    "Budgets",
    "Reservation",
    "budget_keys",
    "period_of",
]

# KEYS[1] = totals, KEYS[2] = held; ARGV: limit, amount, member, hold ms, expire-at (s).
# Frees expired reservations first; then admits only if spent + reserved + amount <= limit.
# Returns {1, remaining after} or {0, remaining}.
RESERVE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #stale > 0 then
  local freed = 0
  for _, m in ipairs(stale) do freed = freed + tonumber(string.match(m, ':(%d+)$')) end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  redis.call('HINCRBY', KEYS[1], 'reserved', -freed)
end
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent') or '0')
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved') or '0')
local left = tonumber(ARGV[1]) - spent - reserved
local amount = tonumber(ARGV[2])
if amount > left then return {0, left} end
redis.call('HINCRBY', KEYS[1], 'reserved', amount)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[3])
redis.call('EXPIREAT', KEYS[1], ARGV[5])
redis.call('EXPIREAT', KEYS[2], ARGV[5])
return {1, left - amount}
"""

# KEYS as above; ARGV: member, reserved amount, real cost, expire-at. Settles (cost > 0)
# or releases (cost 0); a reservation already freed as stale is not freed twice.
RELEASE_SCRIPT = """
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'reserved', -tonumber(ARGV[2]))
end
if tonumber(ARGV[3]) > 0 then
  redis.call('HINCRBY', KEYS[1], 'spent', ARGV[3])
  redis.call('EXPIREAT', KEYS[1], ARGV[4])
end
return 1
"""

_PROCESS = secrets.token_hex(4)  # reservation ids are unique across origin processes


class BudgetUnavailableError(PrismError):
    """The budget cannot be checked (Redis unavailable): refused, never admitted unchecked."""

    status = 503
    type = "server_error"
    default_code = "budget_unavailable"


class Reservation(NamedTuple):
    key: str
    held: str
    member: str
    amount: int  # micro-USD
    expire_at: int  # unix seconds


def period_of(budget_period: str, now: datetime) -> tuple[str, datetime]:
    """The period's id and when it ends (UTC)."""
    if budget_period == "day":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.strftime("%Y-%m-%d"), start + timedelta(days=1)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start.strftime("%Y-%m"), end


def budget_keys(project: str, period_id: str) -> tuple[str, str]:
    key = f"prism:budget:{project}:{period_id}"
    return key, key + ":held"


def _usd(micros: int) -> str:
    return f"${max(micros, 0) / 1_000_000:,.6f}".rstrip("0").rstrip(".")


_RESERVE = LoadedScript(RESERVE_SCRIPT, 2)
_RELEASE = LoadedScript(RELEASE_SCRIPT, 2)


class Budgets:
    def __init__(
        self,
        redis: RedisClient,
        config: ProviderConfig,
        hold_seconds: float = 900.0,
    ) -> None:
        self._redis = redis
        self._config = config
        self._hold_ms = int(hold_seconds * 1000)
        # public model -> (its first target's price, the highest it may be charged)
        self._prices: dict[str, tuple[Price | None, Price | None]] = {}
        self._ids = itertools.count()

    def model_prices(self, model: str) -> tuple[Price | None, Price | None]:
        """``ProviderConfig.model_prices`` (what a hit on ``model`` saves; the highest price
        any of its targets may charge), once per model."""
        prices = self._prices.get(model)
        if prices is None:
            if len(self._prices) >= 4096:
                self._prices.clear()
            prices = self._prices[model] = self._config.model_prices(model)
        return prices

    def bound(self, model: str, prompt_tokens: int, completion_tokens: int) -> int | None:
        """The most a request of ``model`` with these token bounds can cost, in micro-USD;
        None: the model has no price."""
        price = self.model_prices(model)[1]
        if price is None:
            return None
        return math.ceil(prompt_tokens * price.max_input + completion_tokens * price.output)

    async def reserve(
        self, project: str, budget: Budget, model: str, prompt_tokens: int, completion_tokens: int
    ) -> Reservation | None:
        """Reserve the request's bound, or raise: 429 ``budget_exceeded`` (does not fit),
        403 ``model_not_priced``, 503 ``budget_unavailable`` (Redis failed). None: the
        model has no route, so no call will be made (the router answers 404)."""
        amount = self.bound(model, prompt_tokens, completion_tokens)
        if amount is None and self._config.route(model) is None:
            return None
        if amount is None:
            raise PermissionDeniedError(
                f"Model '{model[:200]}' has no price, so this project's budget cannot "
                "admit it; an administrator must add one (providers file, "
                "[providers.NAME.prices]).",
                param="model",
                code="model_not_priced",
            )
        now = datetime.now(UTC)
        period_id, ends = period_of(budget.period, now)
        key, held = budget_keys(project, period_id)
        expire_at = int((ends + timedelta(days=1)).timestamp())
        member = f"{_PROCESS}-{next(self._ids)}:{amount}"
        try:
            admitted, left = await _RESERVE.run(
                self._redis,
                key,
                held,
                budget.micro_usd,
                amount,
                member,
                self._hold_ms,
                expire_at,
            )
        except RedisClientError:
            raise BudgetUnavailableError(
                "This project's budget cannot be checked right now; retry shortly.",
                headers={"retry-after": "1"},
            ) from None
        if not admitted:
            per = "daily" if budget.period == "day" else "monthly"
            wait = max(1, int((ends - now).total_seconds()) + 1)
            raise RateLimitError(
                f"This project's {per} budget of {_usd(budget.micro_usd)} does not cover this "
                f"request: {_usd(left)} remains and the request may cost up to "
                f"{_usd(amount)} (its input and max_tokens at the model's price). The "
                f"budget renews at {ends.strftime('%Y-%m-%d %H:%M')} UTC; a smaller "
                "request may fit now.",
                code="budget_exceeded",
                headers={"retry-after": str(wait)},
            )
        return Reservation(key, held, member, amount, expire_at)

    async def settle(self, reservation: Reservation, cost: int) -> bool:
        """Replace the reservation by the real ``cost`` (0: release it); False if Redis
        failed (the reservation is then freed by its deadline, the cost not recorded)."""
        try:
            await _RELEASE.run(
                self._redis,
                reservation.key,
                reservation.held,
                reservation.member,
                reservation.amount,
                max(cost, 0),
                reservation.expire_at,
            )
        except RedisClientError:
            return False
        return True
