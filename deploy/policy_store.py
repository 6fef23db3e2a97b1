"""Project policies: the record in Redis, and its copy in Workers KV for the edge.

Redis (the source of truth)::

    prism:policy:<project>   string   the policy's canonical JSON (prism.policy); the
                                      origin reads it with every request's lookup

    prism:limits:<project>   hash     the policy's rate limits in the form the origin's
                                      lookup script reads (prism.rate_limits), written
                                      in the same transaction as the policy, and the
                                      origin's state of each limit (fields "s.*", kept
                                      across changes); absent when the policy sets none

    prism:audit              stream   every change, before and after (origin/governance/audit.py),
                                      written in the same transaction as the change

Workers KV (the edge's copy)::

    prism:policy:<project>   the same JSON, read by each isolate at most once a minute
                             per project (edge/policy_cache.py); a cleared policy is
                             published as the empty policy (every model allowed)

One KV record per project, not one for all: the edge reads only the caller's project,
a change to one project rewrites one small record, and two projects changed at once
never race over a shared value. As with revocations, Redis is written first and alone
decides success; KV is republished from Redis, so publishing again repairs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import cast

import redis

from origin.governance.audit import audit_record
from prism import (
    Budget,
    CacheRules,
    LogRules,
    Policy,
    RateLimits,
    limits_key,
    policy_key,
    valid_project_id,
)

from . import audit_log
from .revocation_publisher import KVRevocationPublisher
from .store_errors import KeyStoreError, redact_url, translated

__all__ = ["PolicyChange", "PolicyStore", "check_project", "sync_policy"]

PolicyChange = tuple[Policy | None, Policy | None]  # (before, after)


def check_project(project: str) -> str:
    """``project`` if it is a valid project id, else ``ValueError`` saying what is."""
    if not valid_project_id(project):
        raise ValueError(
            f"--project: {project[:70]!r} is not a project id (1-63 of a-z, 0-9, '-' and "
            "'_', starting with a letter or digit)"
        )
    return project


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class PolicyStore:
    """Policies of every project in one Redis (see the module docstring for the layout)."""

    def __init__(self, client: redis.Redis, *, location: str = "redis") -> None:
        self._redis = client
        self._location = location

    @classmethod
    def from_url(cls, url: str, *, timeout: float = 5.0) -> PolicyStore:
        """A store on ``url``; ``ValueError`` if the URL is malformed. Connects lazily."""
        client = redis.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=timeout, socket_timeout=timeout
        )
        return cls(client, location=redact_url(url))

    @property
    def client(self) -> redis.Redis:
        return self._redis

    def close(self) -> None:
        self._redis.close()

    def raw(self, project: str) -> str | None:
        with translated(self._location):
            return cast(str | None, self._redis.get(policy_key(check_project(project))))

    def get(self, project: str) -> Policy | None:
        """The project's policy; ``KeyStoreError`` if the stored record does not parse."""
        raw = self.raw(project)
        if raw is None:
            return None
        try:
            return Policy.parse(raw)
        except ValueError as error:
            raise KeyStoreError(
                f"the stored policy of {project!r} is invalid ({error}); set it again"
            ) from None

    def set(
        self,
        project: str,
        *,
        allow: Sequence[str] = (),
        deny: Sequence[str] = (),
        budget: Budget | None = None,
        rate_limits: RateLimits | None = None,
        updated_by: str | None = None,
        cache: CacheRules | None = None,
        log: LogRules | None = None,
    ) -> PolicyChange:
        """Replace the project's policy; ``ValueError`` (and nothing changed) if invalid."""
        check_project(project)
        draft = Policy(
            allow=tuple(allow),
            deny=tuple(deny),
            budget=budget,
            rate_limits=rate_limits,
            updated_by=updated_by,
            cache=cache,
            log=log,
        )
        return self._change(project, lambda before: _next(draft, before))

    def clear(self, project: str, *, actor: str | None = None) -> PolicyChange:
        """Remove the project's policy (every model allowed again)."""
        check_project(project)
        return self._change(project, lambda before: None, actor)

    def _change(
        self,
        project: str,
        make: Callable[[Policy | None], Policy | None],
        actor: str | None = None,
    ) -> PolicyChange:
        name = policy_key(project)
        change: list[PolicyChange] = []

        def update(pipe: redis.client.Pipeline) -> None:
            raw = cast(str | None, pipe.get(name))
            before = _parsed_or_none(raw)
            after = make(before)
            prev = audit_log.head(pipe)
            # The origin keeps each limit's state (fields "s.*") in the same hash: a change
            # replaces the limits and keeps the states; no limits, no hash.
            limits = limits_key(project)
            stale = [f for f in cast(list[str], pipe.hkeys(limits)) if not f.startswith("s.")]
            pipe.multi()
            if after is None:
                pipe.delete(name)
            else:
                pipe.set(name, after.encode())
            # The limits' compact form changes with the record, in the same transaction.
            if after is None or after.rate_limits is None:
                pipe.delete(limits)
            else:
                if stale:
                    pipe.hdel(limits, *stale)
                pipe.hset(limits, mapping=dict(after.rate_limits.hash_fields()))  # type: ignore[arg-type]
            # The change and its audit record land together, or neither does.
            fields = audit_record(
                "policy.set" if after is not None else "policy.clear",
                project,
                actor if after is None else after.updated_by,
                before=_stored(raw, before),
                after=None if after is None else after.to_dict(),
            )
            audit_log.stage(pipe, fields, prev)
            change[:] = [(before, after)]

        with translated(self._location):
            self._redis.transaction(update, name, audit_log.AUDIT_HEAD)
        return change[0]


def _stored(raw: str | None, parsed: Policy | None) -> object:
    # What was there before, as the audit log keeps it: a broken record verbatim.
    if parsed is not None:
        return parsed.to_dict()
    return None if raw is None else {"invalid_record": raw[:1000]}


def _parsed_or_none(raw: str | None) -> Policy | None:
    # A hand-broken record is replaced by the next set rather than blocking it.
    try:
        return None if raw is None else Policy.parse(raw)
    except ValueError:
        return None


def _next(draft: Policy, before: Policy | None) -> Policy:
    return dataclasses.replace(
        draft, revision=(before.revision if before else 0) + 1, updated_at=_now()
    )


def sync_policy(
    store: PolicyStore, project: str, publisher: KVRevocationPublisher, rounds: int = 3
) -> bool:
    """Publish the project's Redis record to KV until KV holds the latest one: a change
    made while publishing is published again, so concurrent setters end with the last."""
    raw = store.raw(project)
    for _ in range(max(1, rounds)):
        if not publisher.publish_text(raw if raw is not None else Policy().encode().decode()):
            return False
        latest = store.raw(project)
        if latest == raw:
            return True
        raw = latest
    return True
