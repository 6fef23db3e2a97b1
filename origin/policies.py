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

from prism import PermissionDeniedError, Policy, PolicyMemo

from .cache import Lookup

__all__ = ["ProjectPolicies"]

log = logging.getLogger("prism.origin")

_MAX_PROJECTS = 10_000


class ProjectPolicies:
    def __init__(self) -> None:
        self._parsed = PolicyMemo()
        self._last: dict[str, Policy] = {}
        self._warned: set[bytes] = set()  # invalid records already logged

    def resolve(self, project: str, lookup: Lookup) -> Policy | None:
        """The policy that holds for ``project`` now; None: every model is allowed.

        A stored record that does not parse (edited by hand) refuses every model of the
        project (403 ``policy_invalid``): a policy fails closed, never open.
        """
        if not lookup.available:
            return self._last.get(project)
        raw = lookup.policy
        if raw is None:
            if project in self._last:
                del self._last[project]
            return None
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
        if self._last.get(project) is not policy:
            if len(self._last) >= _MAX_PROJECTS:
                self._last.clear()
            self._last[project] = policy
        return policy
