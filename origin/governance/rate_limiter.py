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
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from prism import LIMITS_KEY_PREFIX, RateLimitError

from ..connection.redis_client import LoadedScript, RedisClient, RedisClientError
from ..http.responses import RawHeaders
from ..metrics import Metrics
from ..providers.token_counts import tokens_of
from .audit import AuditWriter, audit_record

__all__ = [
    "GCRA_LUA",
    "RATE_CHECK_SCRIPT",
    "REQUEST_LIMIT_LUA",
    "RateLimiter",
    "RefusalLog",
    "TokenCharge",
    "duration",
    "rate_limit_error",
    "request_headers",
]

log = logging.getLogger("prism.origin")

# A lease never holds more than this share of the smallest limit it draws on: with
# limits under 2 x LEASE_SHARE a minute every request is checked in Redis, one by one.
LEASE_SHARE = 1000
# How long a process may spend the permits it leased, in seconds.
LEASE_SECONDS = 1.0

# The shared Lua. A limit and its state live in the project's limits hash (one HMGET
# reads both, one HSET writes every state): ``rpm``, ``key.rpm``, ``id.{key}.rpm`` are the
# limits (``prism.rate_limits``), ``s.rpm`` and ``s.{key}.rpm`` their TATs ("tpm" alike).
# A check is {limit, state field, scope (1 project, 2 key), tat}. The reply is {admitted,
# limit, remaining, reset_ms, retry_ms, scope} for the limit that binds: when refused, the
# one to wait longest for; else the one with least left. A request of cost c fits when
# (tat - now) + c * step <= PERIOD + step / 2: the half step absorbs float rounding, so
# exactly N unit requests fit a full bucket of N. Numbers given to redis.call are written
# with 17 significant digits: a TAT's double survives the round trip exactly.
GCRA_LUA = f"""
local PERIOD = 60000000
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function checks_for(project, key_id, kind)
  local h = '{LIMITS_KEY_PREFIX}' .. project
  local mine = 's.' .. key_id .. '.' .. kind
  local got = redis.call('HMGET', h, kind, 'key.' .. kind, 'id.' .. key_id .. '.' .. kind,
                         's.' .. kind, mine)
  local checks = {{}}
  if got[1] then checks[1] = {{tonumber(got[1]), 's.' .. kind, 1, tonumber(got[4])}} end
  local per_key = got[3] or got[2]
  if per_key then checks[#checks + 1] = {{tonumber(per_key), mine, 2, tonumber(got[5])}} end
  return h, checks
end
local function gcra(h, checks, cost, now)
  local worst = nil
  for _, c in ipairs(checks) do
    local step = PERIOD / c[1]
    if c[4] == nil or c[4] < now then c[4] = now end
    c[5] = step
    c[6] = c[4] + cost * step
    c[7] = c[6] - now - PERIOD - step / 2
    if c[7] > 0 and (worst == nil or c[7] > worst[7]) then worst = c end
  end
  if worst ~= nil then
    local n = math.max(0, math.floor((PERIOD + worst[5] / 2 - (worst[4] - now)) / worst[5]))
    return {{0, worst[1], n, math.ceil((worst[4] - now) / 1000), math.ceil(worst[7] / 1000),
            worst[3]}}
  end
  local least, least_left, fields = nil, nil, {{}}
  for _, c in ipairs(checks) do
    fields[#fields + 1] = c[2]
    fields[#fields + 1] = c[6]
    local n = math.max(0, math.floor((PERIOD + c[5] / 2 - (c[6] - now)) / c[5]))
    if least == nil or n < least_left then least, least_left = c, n end
  end
  redis.call('HSET', h, unpack(fields))
  return {{1, least[1], least_left, math.ceil((least[6] - now) / 1000), 0, least[3]}}
end
local function give_back(h, checks, cost, now)
  for _, c in ipairs(checks) do
    if c[4] ~= nil then
      local tat = c[4] - cost * PERIOD / c[1]
      if tat <= now then redis.call('HDEL', h, c[2]) else redis.call('HSET', h, c[2], tat) end
    end
  end
end
"""

# Spliced into the lookup script, where ``project``, ``ARGV[1]`` (the key id) and ``want``
# (the permits asked for, >= 1) are set and ``rate`` is nil: sets ``rate`` to the GCRA
# reply, with the permits granted appended, when a request limit applies. The same
# algorithm as ``GCRA_LUA`` written out flat (it runs on every lease of a limited
# project, where each allocation and call shows), taking up to ``want`` permits at once
# but never more than fit now, nor more than a ``LEASE_SHARE``th of the smallest limit.
REQUEST_LIMIT_LUA = f"""
local h = '{LIMITS_KEY_PREFIX}' .. project
local mine = 's.' .. ARGV[1] .. '.rpm'
local got = redis.call('HMGET', h, 'rpm', 'key.rpm', 'id.' .. ARGV[1] .. '.rpm', 's.rpm', mine)
local per_key = got[3] or got[2]
if got[1] or per_key then
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local PERIOD = 60000000
  local worst, worst_over, fits, smallest = nil, 0, nil, nil
  local checks = {{}}
  if got[1] then checks[1] = {{tonumber(got[1]), 's.rpm', 1, tonumber(got[4]) or now}} end
  if per_key then checks[#checks + 1] = {{tonumber(per_key), mine, 2, tonumber(got[5]) or now}} end
  for _, c in ipairs(checks) do
    local step = PERIOD / c[1]
    if c[4] < now then c[4] = now end
    local over = c[4] + step - now - PERIOD - step / 2
    if over > 0 and over > worst_over then worst, worst_over = c, over end
    c[5] = step
    c[6] = math.floor((PERIOD + step / 2 - (c[4] - now)) / step)
    if fits == nil or c[6] < fits then fits = c[6] end
    if smallest == nil or c[1] < smallest then smallest = c[1] end
  end
  if worst then
    rate = {{0, worst[1], math.max(0, worst[6]), math.ceil((worst[4] - now) / 1000),
            math.ceil(worst_over / 1000), worst[3]}}
  else
    local grant = math.min(want, fits, math.max(1, math.floor(smallest / {LEASE_SHARE})))
    local fields, least, least_left, least_tat = {{}}, nil, nil, nil
    for _, c in ipairs(checks) do
      local new = c[4] + grant * c[5]
      fields[#fields + 1] = c[2]
      fields[#fields + 1] = new
      local left = c[6] - grant
      if least == nil or left < least_left then least, least_left, least_tat = c, left, new end
    end
    redis.call('HSET', h, unpack(fields))
    rate = {{1, least[1], least_left, math.ceil((least_tat - now) / 1000), 0, least[3], grant}}
  end
end
"""

# The request check alone, on the primary after a replica's lookup: ARGV = key id,
# project, permits wanted. Reply: the GCRA reply, or {} when no request limit applies.
RATE_CHECK_SCRIPT = f"""
local project, want, rate = ARGV[2], tonumber(ARGV[3]), nil
{REQUEST_LIMIT_LUA}
return rate or {{}}
"""

# ARGV: project, key id, token cost, '1' to give a request slot back when refused.
# Reply: the GCRA reply, or {2} when no token limit applies (any more).
_ADMIT_TOKENS = (
    GCRA_LUA
    + """
local h, checks = checks_for(ARGV[1], ARGV[2], 'tpm')
if #checks == 0 then return {2} end
local now = now_us()
local rate = gcra(h, checks, tonumber(ARGV[3]), now)
if rate[1] == 0 and ARGV[4] == '1' then
  local _, requests = checks_for(ARGV[1], ARGV[2], 'rpm')
  give_back(h, requests, 1, now)
end
return rate
"""
)

# ARGV: project, key id, tokens to give back (negative: to take more).
_SETTLE_TOKENS = (
    GCRA_LUA
    + """
local h, checks = checks_for(ARGV[1], ARGV[2], 'tpm')
give_back(h, checks, tonumber(ARGV[3]), now_us())
return 1
"""
)

_SCOPES = {1: "project", 2: "key"}
_LIMIT_REQUESTS = b"x-ratelimit-limit-requests"
_REMAINING_REQUESTS = b"x-ratelimit-remaining-requests"
_RESET_REQUESTS = b"x-ratelimit-reset-requests"


def duration(ms: int) -> str:
    """``ms`` as OpenAI writes its reset headers (Go's duration form): 0s, 12ms, 1.5s,
    6m0s, 1h0m0s."""
    if ms < 1000:
        return f"{ms}ms" if ms > 0 else "0s"
    seconds, millis = divmod(ms, 1000)
    minutes, seconds = divmod(seconds, 60)
    text = f"{seconds}.{millis:03d}".rstrip("0") + "s" if millis else f"{seconds}s"
    if not minutes:
        return text
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m{text}" if hours else f"{minutes}m{text}"


def request_headers(rate: list[int]) -> dict[str, str]:
    """The x-ratelimit-*-requests headers from the lookup script's reply."""
    return {
        "x-ratelimit-limit-requests": str(rate[1]),
        "x-ratelimit-remaining-requests": str(rate[2]),
        "x-ratelimit-reset-requests": duration(rate[3]),
    }


def _token_headers(rate: list[int]) -> dict[str, str]:
    return {
        "x-ratelimit-limit-tokens": str(rate[1]),
        "x-ratelimit-remaining-tokens": str(rate[2]),
        "x-ratelimit-reset-tokens": duration(rate[3]),
    }


def rate_limit_error(
    project: str, key_id: str, kind: str, rate: list[int], headers: dict[str, str], cost: int = 1
) -> RateLimitError:
    """The 429 for a refusal: OpenAI's body (type ``requests`` or ``tokens``, code
    ``rate_limit_exceeded``) and headers (Retry-After, retry-after-ms, x-ratelimit-*)."""
    limit, retry_ms, scope = rate[1], rate[4], _SCOPES.get(rate[5], "project")
    who = f"project {project}" if scope == "project" else f"key {key_id}"
    unit = "requests per min (RPM)" if kind == "requests" else "tokens per min (TPM)"
    if cost > limit:  # can never fit: waiting does not help, a smaller request does
        message = (
            f"Request too large for {who} on {unit}: Limit {limit}, Requested {cost} "
            "(the prompt's size plus max_tokens, or the default cap when unset). "
            "Lower max_tokens or shorten the prompt."
        )
    else:
        message = (
            f"Rate limit reached for {who} on {unit}: Limit {limit}, Requested {cost}. "
            f"Please try again in {duration(retry_ms)}."
        )
    headers["retry-after"] = str(max(1, math.ceil(retry_ms / 1000)))
    headers["retry-after-ms"] = str(retry_ms)
    error = RateLimitError(message, code="rate_limit_exceeded", headers=headers)
    error.type = kind  # as OpenAI: "requests" or "tokens"
    return error


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
        self._admit = LoadedScript(_ADMIT_TOKENS)
        self._settle = LoadedScript(_SETTLE_TOKENS)
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
        scope = _SCOPES.get(rate[5], "project")
        self._metrics.rate_limited.labels(project, kind, scope).inc()
        if self._available():
            self.refusals.record(project, key_id, kind, scope)
        headers = request_headers(rate) if kind == "requests" else _token_headers(rate)
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
        headers.update(_token_headers(rate))
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
