"""Request permits an origin process takes from a project's rate limits ahead of use.

Every request of a project with request limits is checked in Redis, inside the lookup
script (``origin.ratelimits.REQUEST_LIMIT_LUA``): an HMGET, a TIME and an HSET on each
Redis hit. At thousands of hits a second that is most of what a hit costs Redis, and a
slower script slows the auto-pipelined connection every request shares. So a process
that keeps sending a key's requests takes permits in advance: a check may take up to
twice the permits its key's last lease held when that lease was spent within its
lifetime (1, 2, 4 ... never more than fit the bucket now, nor more than
``LEASE_SHARE``th of the smallest limit), and the requests after it spend them here,
their lookup carrying no rate check at all.

Exactness: permits are taken from the bucket (GCRA, in Redis, atomically) when leased,
so every process together never admits more than the limit allows, but a permit may be
spent up to ``LEASE_SECONDS`` after it was taken: at a window's edge a process may admit
up to one lease (a thousandth of the limit) that belongs to the window before. Permits
a process does not spend are not given back; the bucket refills them within a
thousandth of the period. Limits under ``2 x LEASE_SHARE`` a minute never lease: each
of their requests is checked on its own, exactly as before. A policy change reaches a
lease within ``LEASE_SECONDS``. The ``x-ratelimit-*-requests`` headers of a request
served from a lease are the lease's: the remaining count as the bucket had it when
leased, less what the process has spent since, and the reset time as it was then.
"""

from __future__ import annotations

import time

from .ratelimits import LEASE_SECONDS

__all__ = ["ProjectLeases", "RequestLeases"]

_MAX_PROJECTS = 10_000


class _Lease:
    __slots__ = ("left", "limit", "remaining", "reset_ms", "scope", "size", "until")

    def __init__(self, rate: list[int], now: float) -> None:
        # rate: the script's admitted reply [1, limit, remaining, reset_ms, 0, scope, grant]
        self.size = rate[6]
        self.left = self.size - 1  # the request that took the lease spends one
        self.limit, self.remaining, self.reset_ms, self.scope = rate[1], rate[2], rate[3], rate[5]
        self.until = now + LEASE_SECONDS


class ProjectLeases:
    """One project's leases by key id, and the policy record they were taken under: any
    change to it (a limit raised, lowered or removed) ends them all."""

    __slots__ = ("by_key", "policy")

    def __init__(self, policy: bytes | None) -> None:
        self.policy = policy
        self.by_key: dict[str, _Lease] = {}

    def take(self, key_id: str) -> list[int] | None:
        """Spend one of ``key_id``'s leased permits: the verdict a check would have given
        (admitted, with the lease's figures), or None when there is none to spend. The
        caller then confirms that the policy is still ``self.policy``."""
        lease = self.by_key.get(key_id)
        if lease is None or lease.left <= 0 or time.monotonic() >= lease.until:
            return None
        lease.left -= 1
        return [1, lease.limit, lease.remaining + lease.left, lease.reset_ms, 0, lease.scope]

    def want(self, key_id: str) -> str:
        """How many permits the next check asks for, as the lookup script's argument."""
        lease = self.by_key.get(key_id)
        if lease is None or lease.size <= 0:
            return "1"
        if lease.left <= 0 and time.monotonic() < lease.until:
            return str(lease.size * 2)  # spent within its lifetime: busy enough for more
        return str(max(1, lease.size - lease.left))  # what was spent of the last one


class RequestLeases:
    """Leases by project: a project without request limits has none, and its requests pay
    one dict lookup here."""

    __slots__ = ("by_project",)

    def __init__(self) -> None:
        self.by_project: dict[str, ProjectLeases] = {}

    def record(self, project: str, key_id: str, rate: list[int], policy: bytes | None) -> None:
        """Keep what a check granted (its reply) under the policy record it read; a
        refusal leaves nothing to spend."""
        held = self.by_project.get(project)
        if held is None or held.policy != policy:
            if len(self.by_project) >= _MAX_PROJECTS:
                self.by_project.clear()
            held = self.by_project[project] = ProjectLeases(policy)
        if rate[0] and len(rate) > 6:
            held.by_key[key_id] = _Lease(rate, time.monotonic())
        else:
            held.by_key.pop(key_id, None)
