"""Request permits an origin process takes from a project's rate limits ahead of use.

Every request of a project with request limits is checked in Redis, inside the lookup
script (``origin.governance.rate_limit_scripts.REQUEST_LIMIT_LUA``): an HMGET, a TIME and
an HSET on each Redis hit. At thousands of hits a second that is most of what a hit costs
Redis, and a slower script slows the auto-pipelined connection every request shares. So a
process that keeps sending a key's requests takes permits in advance, in leases, and the
requests spend them here, their lookup carrying no rate check at all.

- One request at a time asks for a key's next lease (``asking``): while it waits, the
  key's other requests without a permit are checked one by one, each taking exactly
  its own permit. (Were each to ask for a lease, 32 requests in flight would take 32
  leases and keep one: the bucket would drain 30 times faster than requests came.)
- The next lease is asked for before the current one runs out, when a quarter of it is
  left, by a request that spends a permit anyway (once per lease): a busy key is never
  without permits. Its size is what the current one's pace would spend within a lifetime
  from now, less what the current one still holds (at most twice its size; none when
  that is under 2: a slow key asks when it runs out).
- A key without permits asks for twice the last lease's size when it was spent within
  its lifetime (1, 2, 4 ...), else for what it spent; and every ask is for at least twice
  the requests checked one by one since the last (many requests at once grow it in one
  step). Never more than fit the bucket now, nor more than ``LEASE_SHARE``th of the
  smallest limit (the script caps it).

Exactness: permits are taken from the bucket (GCRA, in Redis, atomically) when leased,
so every process together never admits more than the limit allows, but a permit may be
spent up to ``LEASE_SECONDS`` after it was taken: at a window's edge a process may admit
up to two leases (two thousandths of the limit) that belong to the window before.
Permits a process does not spend are not given back; the bucket refills them within
two thousandths of the period. Limits under ``2 x LEASE_SHARE`` a minute never lease:
each of their requests is checked on its own. A policy change reaches a lease at the
key's next request (the lookup brings the policy record; a lease taken under another
one is void). The ``x-ratelimit-*-requests`` headers of a request served from a lease
are the lease's: what the bucket had left when the key's last lease was taken, plus the
permits the process still holds for the key, and the reset time as it was then.
"""

from __future__ import annotations

import time

__all__ = ["LEASE_SECONDS", "ProjectLeases", "RequestLeases"]

# How long a process may spend the permits it leased, in seconds.
LEASE_SECONDS = 1.0

_MAX_PROJECTS = 10_000
_MAX_KEYS = 100_000  # per project


class _Lease:
    __slots__ = (
        "ahead", "left", "limit", "remaining", "reset_ms", "scope", "size", "taken", "until",
    )  # fmt: skip

    def __init__(self, rate: list[int], now: float, spent: bool) -> None:
        # rate: the script's admitted reply [1, limit, remaining, reset_ms, 0, scope, grant]
        self.size = rate[6]
        self.left = self.size - 1 if spent else self.size  # the asking request's own permit
        self.limit, self.reset_ms, self.scope = rate[1], rate[3], rate[5]
        self.remaining = min(rate[2], self.limit - self.left)  # the header: never above the limit
        self.taken, self.until = now, now + LEASE_SECONDS
        self.ahead = False  # the next lease has been asked for while spending this one


class _KeyLeases:
    """One key's permits: the lease being spent, the next one, and whether a request
    is asking for one now."""

    __slots__ = ("alone", "asking", "current", "next")

    def __init__(self) -> None:
        self.current: _Lease | None = None
        self.next: _Lease | None = None
        self.asking = False
        self.alone = 0  # requests checked one by one since the last ask

    def ask(self, size: int) -> int:
        """This request asks for the next lease: how many permits."""
        self.asking = True
        want, self.alone = max(size, 2 * self.alone), 0
        return want


class ProjectLeases:
    """One project's leases by key id, and the policy record they were taken under: any
    change to it (a limit raised, lowered or removed) ends them all."""

    __slots__ = ("by_key", "policy")

    def __init__(self, policy: bytes | None) -> None:
        self.policy = policy
        self.by_key: dict[str, _KeyLeases] = {}

    def take(self, key_id: str) -> tuple[list[int] | None, int, bool]:
        """Spend one of ``key_id``'s leased permits: ``(verdict, want, asks)``.

        ``verdict``: what a check would have said (admitted, with the lease's figures),
        or None when there is no permit to spend: the request must be checked. ``want``:
        the permits its lookup asks Redis for (0: no check). ``asks``: this request asks
        for the key's next lease, and must hand the reply to ``RequestLeases.record``
        (or, failing, call ``unask``); else a check takes only its own permit. The caller
        then confirms that the policy is still ``self.policy``."""
        keyed = self.by_key.get(key_id)
        if keyed is None:
            keyed = self.key(key_id)
        now = time.monotonic()
        lease = keyed.current
        if lease is None or lease.left <= 0 or now >= lease.until:
            following = keyed.next
            if following is None or following.left <= 0 or now >= following.until:
                if keyed.asking:  # another request is asking: this one is checked alone
                    keyed.alone += 1
                    return None, 1, False
                if lease is None:
                    return None, keyed.ask(1), True
                if now < lease.until:  # spent within its lifetime: busy enough for more
                    return None, keyed.ask(lease.size * 2), True
                return None, keyed.ask(max(1, lease.size - lease.left)), True  # what it spent
            keyed.current, keyed.next, lease = following, None, following
        lease.left -= 1
        verdict = [1, lease.limit, lease.remaining + lease.left, lease.reset_ms, 0, lease.scope]
        if lease.left > lease.size >> 2 or lease.ahead or keyed.asking:
            return verdict, 0, False
        # A quarter left: the next one, as large as this one's pace would spend within a
        # lifetime from now, less what this one still holds.
        lease.ahead = True
        spent = lease.size - lease.left
        pace = spent * LEASE_SECONDS / max(now - lease.taken, 1e-6)
        size = min(lease.size * 2, int(pace) - lease.left)
        if size < 2:  # too slow to need one ahead: asked for when it runs out
            return verdict, 0, False
        return verdict, keyed.ask(size), True

    def key(self, key_id: str) -> _KeyLeases:
        """``key_id``'s leases, made when it has none."""
        keyed = self.by_key.get(key_id)
        if keyed is None:
            if len(self.by_key) >= _MAX_KEYS:
                self.by_key.clear()
            keyed = self.by_key[key_id] = _KeyLeases()
        return keyed

    def unask(self, key_id: str) -> None:
        """The request asking for the next lease got no answer (Redis failed, or it was
        cancelled): another may ask."""
        keyed = self.by_key.get(key_id)
        if keyed is not None:
            keyed.asking = False


class RequestLeases:
    """Leases by project: a project without request limits has none, and its requests pay
    one dict lookup here."""

    __slots__ = ("by_project",)

    def __init__(self) -> None:
        self.by_project: dict[str, ProjectLeases] = {}

    def record(
        self,
        project: str,
        key_id: str,
        rate: list[int],
        policy: bytes | None,
        spent: bool,
        asked: bool,
    ) -> int:
        """Keep the lease a check granted (its reply, under the policy record it read):
        ``spent``, the request takes one of its permits; ``asked``, it is the key's ask
        (``take``). A refusal leaves nothing new to spend. Returns the permits the key now
        holds beyond the bucket's count in ``rate`` (for the request's header)."""
        held = self.by_project.get(project)
        if held is None or held.policy != policy:
            if len(self.by_project) >= _MAX_PROJECTS:
                self.by_project.clear()
            held = self.by_project[project] = ProjectLeases(policy)
        keyed = held.key(key_id)
        if asked:
            keyed.asking = False
        if not rate[0] or len(rate) <= 6:
            return 0
        now = time.monotonic()
        lease = _Lease(rate, now, spent)
        current = keyed.current
        if current is None or current.left <= 0 or now >= current.until:
            keyed.current = lease
            return lease.left
        if keyed.next is None or keyed.next.left <= 0 or now >= keyed.next.until:
            keyed.next = lease  # asked for ahead: spent once the current one is
            # The current one's headers from here on: the bucket now, and both leases.
            current.remaining = min(rate[2] + lease.left, current.limit - current.left)
        return current.left + lease.left
