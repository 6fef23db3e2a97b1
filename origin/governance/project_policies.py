"""Project policies as the origin sees them: the record its lookup brought back, parsed
only when its bytes change, and the last one seen per project for when Redis is down.

The record travels in the request's one Redis command (``RedisCache.lookup``), so an
unchanged policy costs a dict lookup per request, never a parse or a round trip. While
Redis is unavailable the last policy seen for the project still holds: a denied model
stays denied through an outage (an origin that starts during one knows no policy
until Redis answers, as with revocations).
"""

from __future__ import annotations

import logging
from typing import Protocol

from prism import PermissionDeniedError, Policy, PolicyMemo

__all__ = ["ProjectPolicies"]

log = logging.getLogger("prism.origin")


class PolicyRead(Protocol):
    """What a lookup brought back of the policy (``origin.store.redis_cache.Lookup``)."""

    @property
    def available(self) -> bool: ...  # False: Redis was not asked or failed

    @property
    def policy(self) -> bytes | None: ...  # the record as stored (None: no policy)


_MAX_PROJECTS = 10_000


class ProjectPolicies:
    def __init__(self) -> None:
        self._parsed = PolicyMemo()
        # The last record seen per project and its policy: an unchanged record (nearly
        # every request) is recognised by one comparison, without hashing its bytes.
        self._last: dict[str, tuple[bytes, Policy]] = {}
        self._warned: set[bytes] = set()  # invalid records already logged

    def resolve(self, project: str, lookup: PolicyRead) -> Policy | None:
        """The policy that holds for ``project`` now; None: every model is allowed.

        A stored record that does not parse (edited by hand) refuses every model of the
        project (403 ``policy_invalid``): a policy fails closed, never open.
        """
        last = self._last.get(project)
        if not lookup.available:
            return None if last is None else last[1]
        raw = lookup.policy
        if raw is None:
            if last is not None:
                del self._last[project]
            return None
        if last is not None and last[0] == raw:
            return last[1]
        try:
            policy = self._parsed.get(raw)
        except ValueError as error:
            if raw not in self._warned and len(self._warned) < _MAX_PROJECTS:
                self._warned.add(raw)
                log.warning("project %s: its stored policy is invalid (%s)", project, error)
            raise PermissionDeniedError(
                "This project's model policy is invalid; an administrator must set it "
                "again (`prism policy set`).",
                code="policy_invalid",
            ) from None
        if len(self._last) >= _MAX_PROJECTS:
            self._last.clear()
        self._last[project] = (raw, policy)
        return policy
