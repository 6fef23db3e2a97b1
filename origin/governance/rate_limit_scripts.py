"""The Lua of the rate limits: GCRA over a project's limits hash, the request check
spliced into the lookup script, the request check alone, and the token admit and settle.

Apart from ``origin.governance.rate_limiter`` (the Python side: refusals, token charges)
because the exact cache builds its one lookup script from ``REQUEST_LIMIT_LUA`` and runs
``RATE_CHECK_SCRIPT`` on the primary: the store takes the scripts without the limiter's
metrics and audit. The algorithm and where each check runs are described there.
"""

from __future__ import annotations

from prism import LIMITS_KEY_PREFIX

__all__ = [
    "ADMIT_TOKENS_SCRIPT",
    "GCRA_LUA",
    "LEASE_SHARE",
    "RATE_CHECK_SCRIPT",
    "REQUEST_LIMIT_LUA",
    "SETTLE_TOKENS_SCRIPT",
]

# A lease never holds more than this share of the smallest limit it draws on: with
# limits under 2 x LEASE_SHARE a minute every request is checked in Redis, one by one.
LEASE_SHARE = 1000

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
ADMIT_TOKENS_SCRIPT = (
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
SETTLE_TOKENS_SCRIPT = (
    GCRA_LUA
    + """
local h, checks = checks_for(ARGV[1], ARGV[2], 'tpm')
give_back(h, checks, tonumber(ARGV[3]), now_us())
return 1
"""
)
