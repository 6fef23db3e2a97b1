"""Rate limits: requests and tokens per minute, per project and per key, held in Redis.

The algorithm is GCRA (the generic cell rate algorithm: a token bucket kept as one
number). Each limit's state is its theoretical arrival time (TAT) in microseconds of
Redis's own clock (``TIME``, never an origin's), kept as a field of the project's limits
hash next to the limit itself: one HMGET reads a request's limits and their states, one
HSET writes them. A limit of N a minute is a bucket of N refilled continuously: N
requests may come at once, then one every 60/N s. O(1) time and memory per limit, exact
across any number of origin processes (each check is one atomic script), and its state
gives OpenAI's headers directly: remaining = what fits now, reset = the time until the
bucket is full. (A sliding-window log is exact too but keeps every request of the
window; window counters are approximate at window edges.)

Where the checks run:

- requests: in the lookup script itself (``REQUEST_LIMIT_LUA``, spliced into
  ``origin.store.redis_cache.LOOKUP_SCRIPT``), so a hit with a limit set is still one round trip;
  a busy key takes its permits in leases and most of its lookups carry no check at all
  (``origin.governance.request_leases``).
  Every API request (chat completions, embeddings, messages) that reaches the origin
  counts: Redis hits, misses and bypasses. A refused request takes nothing and gets no
  entry.
- tokens: on a miss only (a hit costs no provider tokens), in a second script before the
  provider is called: the request is admitted on its token bound (prompt bound plus
  completion bound, ``origin.governance.token_bounds``) and settled to the answer's reported usage
  when
  the call ends, with the budget (``origin.governance.billing.Charge``; the difference goes back).
  A request the token limit refuses gives its request slot back too.

Limits are read from the compact hash ``prism:limits:{project}`` (``prism.rate_limits``);
the lookup script looks at it only when the policy record mentions ``rate_limits``, so
a project without limits pays nothing. While Redis is unavailable there are no limits
(the gateway must never be worse than calling the provider directly).

The Lua of every check is in ``origin.governance.rate_limit_scripts``, the headers and
the 429 a verdict becomes in ``origin.governance.rate_limit_headers``; this module is the
origin's side: token charges, refusals counted and audited.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from prism import RateLimitError

from ..connection.redis_client import LoadedScript, RedisClient, RedisClientError
from ..http.responses import RawHeaders
from ..metrics import Metrics
from ..providers.token_counts import tokens_of
from .audit import AuditWriter, audit_record
from .rate_limit_headers import SCOPES, duration, rate_limit_error, request_headers, token_headers
from .rate_limit_scripts import ADMIT_TOKENS_SCRIPT, SETTLE_TOKENS_SCRIPT

__all__ = ["RateLimiter", "RefusalLog", "TokenCharge"]

log = logging.getLogger("prism.origin")

_LIMIT_REQUESTS = b"x-ratelimit-limit-requests"
_REMAINING_REQUESTS = b"x-ratelimit-remaining-requests"
_RESET_REQUESTS = b"x-ratelimit-reset-requests"


class RefusalLog:
    """Refusals into the audit log, batched: the first refusal of a (project, key, kind)
    is appended at once, the ones after it within ``interval`` seconds become one record
    with their count when the interval ends. A flood of refusals is at most two records
    per key and kind per interval, never a write per refusal."""

    def __init__(
        self,
        audit: AuditWriter,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        interval: float = 60.0,
        max_tracked: int = 10_000,
    ) -> None:
        self._audit = audit
        self._spawn = spawn
        self._interval = interval
        self._max = max_tracked
        self._windows: dict[tuple[str, str, str], list[Any]] = {}  # -> [count, scope]

    def record(self, project: str, key_id: str, kind: str, scope: str) -> None:
        key = (project, key_id, kind)
        window = self._windows.get(key)
        if window is not None:
            window[0] += 1
            return
        if len(self._windows) >= self._max:
            return  # more keys refused at once than tracked: counted in /metrics only
        self._windows[key] = [0, scope]
        self._write(key, scope, 1, None)
        asyncio.get_running_loop().call_later(self._interval, self._flush, key)

    def _flush(self, key: tuple[str, str, str]) -> None:
        window = self._windows.pop(key, None)
        if window is not None and window[0]:
            self._write(key, window[1], window[0], self._interval)

    def _write(
        self, key: tuple[str, str, str], scope: str, count: int, within: float | None
    ) -> None:
        project, key_id, kind = key
        if self._audit.admit():
            detail: dict[str, object] = {"kind": kind, "scope": scope, "count": count}
            if within is not None:  # the refusals after the first, over ``within`` seconds
                detail["within_seconds"] = within
            record = audit_record("ratelimit.refuse", project, f"key:{key_id}", detail=detail)
            self._spawn(self._audit.append(record))


class TokenCharge:
    """Tokens admitted for one miss, settled once to what the answer used."""

    __slots__ = ("_limiter", "_settled", "bound", "key_id", "project", "prompt_bound")

    def __init__(
        self, limiter: RateLimiter, project: str, key_id: str, bound: int, prompt_bound: int
    ) -> None:
        self._limiter = limiter
        self.project, self.key_id = project, key_id
        self.bound, self.prompt_bound = bound, prompt_bound
        self._settled = False

    def settle(self, completion: dict[str, Any] | None) -> None:
        """Give back what the request did not use: the bound minus the reported usage
        (or, without usage, minus the prompt bound plus the answer's size in bytes);
        everything when there is no answer (an error, or the client left)."""
        if self._settled:
            return
        self._settled = True
        used = 0 if completion is None else _used_tokens(completion, self.prompt_bound)
        if used != self.bound:
            self._limiter.give_back(self.project, self.key_id, self.bound - used)


def _used_tokens(completion: dict[str, Any], prompt_bound: int) -> int:
    usage = completion.get("usage")
    if isinstance(usage, dict):
        total = usage.get("total_tokens")
        if isinstance(total, int) and not isinstance(total, bool) and total >= 0:
            return total
        tokens = tokens_of(usage)  # Anthropic's form (a Messages answer) has no total
        if tokens is not None:
            return tokens.prompt + tokens.completion
    # Every token is at least one byte of the answer: an upper bound, never an undercount.
    return prompt_bound + len(orjson.dumps(completion.get("choices")))


class RateLimiter:
    """The origin's side of the token limits and of every refusal (metrics, audit)."""

    def __init__(
        self,
        redis: RedisClient,
        metrics: Metrics,
        audit: AuditWriter,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        available: Callable[[], bool],
    ) -> None:
        self._redis = redis
        self._metrics = metrics
        self._spawn = spawn
        self._available = available
        self._admit = LoadedScript(ADMIT_TOKENS_SCRIPT)
        self._settle = LoadedScript(SETTLE_TOKENS_SCRIPT)
        self.refusals = RefusalLog(audit, spawn)
        # The last limit and reset headers written, for the next request with the same.
        self._limit, self._limit_header = 0, (_LIMIT_REQUESTS, b"0")
        self._reset_ms, self._reset_header = 0, (_RESET_REQUESTS, b"0s")

    def check_requests(self, project: str, key_id: str, rate: list[int]) -> RawHeaders:
        """Apply the lookup's request-limit verdict: raise its 429, or return the
        x-ratelimit-*-requests headers, in wire form."""
        if not rate[0]:
            raise self.refused(project, key_id, "requests", rate)
        # The limit and the reset time stay the same while a lease lasts: encoded once.
        if rate[1] != self._limit:
            self._limit, self._limit_header = rate[1], (_LIMIT_REQUESTS, b"%d" % rate[1])
        if rate[3] != self._reset_ms:
            reset = duration(rate[3]).encode()
            self._reset_ms, self._reset_header = rate[3], (_RESET_REQUESTS, reset)
        return [self._limit_header, (_REMAINING_REQUESTS, b"%d" % rate[2]), self._reset_header]

    def refused(
        self, project: str, key_id: str, kind: str, rate: list[int], cost: int = 1
    ) -> RateLimitError:
        """Count a refusal and make its 429."""
        scope = SCOPES.get(rate[5], "project")
        self._metrics.rate_limited.labels(project, kind, scope).inc()
        if self._available():
            self.refusals.record(project, key_id, kind, scope)
        headers = request_headers(rate) if kind == "requests" else token_headers(rate)
        return rate_limit_error(project, key_id, kind, rate, headers, cost)

    async def admit_tokens(
        self,
        project: str,
        key_id: str,
        prompt_bound: int,
        completion_bound: int,
        headers: dict[str, str],
        requests_counted: bool,
    ) -> TokenCharge | None:
        """Admit a miss on its token bound, adding the x-ratelimit-*-tokens headers to
        ``headers``; raise the 429 when refused. None: nothing to settle (no token limit
        applies, or Redis failed: no limits without Redis)."""
        cost = prompt_bound + completion_bound
        try:
            rate = await self._admit.run(
                self._redis, project, key_id, cost, "1" if requests_counted else "0"
            )
        except RedisClientError as error:
            self._metrics.redis_errors.labels("rate_limit").inc()
            log.warning("token rate limit not checked for project %s: %s", project, error)
            return None
        if rate[0] == 2:
            return None
        if not rate[0]:
            raise self.refused(project, key_id, "tokens", rate, cost)
        headers.update(token_headers(rate))
        return TokenCharge(self, project, key_id, cost, prompt_bound)

    def give_back(self, project: str, key_id: str, tokens: int) -> None:
        """Return unused tokens (negative: charge more), after the response."""
        self._spawn(self._give_back(project, key_id, tokens))

    async def _give_back(self, project: str, key_id: str, tokens: int) -> None:
        try:
            await self._settle.run(self._redis, project, key_id, tokens)
        except RedisClientError as error:
            self._metrics.redis_errors.labels("rate_limit").inc()
            log.warning("token rate limit of project %s not settled: %s", project, error)
