"""Managed API keys: metadata in Redis, revocations to Redis and to the edge's KV set.

Nothing stored here is secret. A key is shown once, when it is created; afterwards
only its SHA-256 and a short non-secret prefix exist. The layout:

Redis (the source of truth)::

    prism:keys:<project>   hash   key_id -> JSON KeyRecord
    prism:projects         set    projects that have (had) managed keys
    prism:revoked          set    revoked key ids of every project; the origin runs
                                  SISMEMBER on it for every request
    prism:audit            stream every creation and revocation
                                  (origin/governance/audit.py), written in the same
                                  transaction as the change

Workers KV (the edge's copy)::

    prism:revoked          JSON list of the same ids, read by each isolate at most
                           once a minute (edge/revocation.py)

Redis is written first and alone decides success, so a revocation holds at the
origin even when KV is unreachable; the KV copy is republished whole from the Redis
set, so any later publish (the next revoke, or ``sync_revocations``) repairs it
(``deploy.revocation_publisher``). The stores' errors are in ``deploy.store_errors``.
"""

from __future__ import annotations

import builtins
import json
import re
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, cast

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from origin.governance.audit import audit_record
from prism import REVOKED_KEY, KeyRing, PrismError, key_hash
from prism.routes import DEFAULT_REDIS_URL

from . import audit_log
from .store_errors import KeyStoreError, UnknownKeyError, redact_url, translated

__all__ = [
    "DEFAULT_REDIS_URL",
    "PROJECTS_KEY",
    "CreatedKey",
    "KeyRecord",
    "KeyStore",
    "keys_key",
]

PROJECTS_KEY = "prism:projects"
_KEY_ID_RE = re.compile(r"[A-Za-z0-9]{8,32}\Z")
_MAX_NAME_LEN = 100
_PREFIX_ID_CHARS = 4


def keys_key(project: str) -> str:
    """The Redis hash holding ``project``'s key records."""
    return f"prism:keys:{project}"


def _now() -> str:
    # Milliseconds, so keys created in the same second still list in creation order.
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _prefix(key: str, key_id: str) -> str:
    # Everything up to the first few characters of the key id: enough for a human to
    # tell a project's keys apart, and never a character of the signature (the
    # signature is the only secret part of a key).
    return key[: key.index(f".{key_id}.") + 1 + _PREFIX_ID_CHARS] + "…"


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What is known about a managed key: everything but the key."""

    key_id: str
    project: str
    version: int
    key_hash: str
    prefix: str
    name: str | None = None
    created_at: str | None = None  # ISO 8601 UTC; None: minted offline, registered on revoke
    revoked_at: str | None = None
    created_by: str | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> KeyRecord:
        data = json.loads(raw)
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)


@dataclass(frozen=True, slots=True)
class CreatedKey:
    """A new key and its record. The key exists only here: show it once, then drop it."""

    key: str = field(repr=False)
    record: KeyRecord


# ----------------------------------------------------------------------------- store


class KeyStore:
    """Managed keys of every project in one Redis (see the module docstring for layout)."""

    def __init__(self, client: redis.Redis, *, location: str = "redis") -> None:
        self._redis = client
        self._location = location

    @classmethod
    def from_url(cls, url: str, *, timeout: float = 5.0) -> KeyStore:
        """A store on ``url``; ``ValueError`` if the URL is malformed. Connects lazily."""
        client = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            # One quick retry: a CLI should fail in a second, not after redis-py's
            # default backoff of several.
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.1), 1),
        )
        return cls(client, location=redact_url(url))

    def close(self) -> None:
        self._redis.close()

    def create(
        self,
        ring: KeyRing,
        project: str,
        *,
        name: str | None = None,
        created_by: str | None = None,
    ) -> CreatedKey:
        """Mint a key for ``project`` and record its metadata; the key is returned once.

        ``ValueError`` for a bad project id or name.
        """
        if name is not None and (len(name) > _MAX_NAME_LEN or not name.isprintable()):
            raise ValueError(f"key name must be at most {_MAX_NAME_LEN} printable characters")
        # Key ids are 64 random bits, so a clash is practically impossible; HSETNX makes
        # one harmless anyway (a clash would otherwise overwrite another key's record).
        for _ in range(3):
            key = ring.mint(project)
            identity = ring.verify(key)
            record = KeyRecord(
                key_id=identity.key_id,
                project=project,
                version=identity.version,
                key_hash=key_hash(key),
                prefix=_prefix(key, identity.key_id),
                name=name,
                created_at=_now(),
                created_by=created_by,
            )
            added = self._add(record, created_by)
            if added:
                return CreatedKey(key=key, record=record)
        raise KeyStoreError("could not allocate an unused key id; try again")

    def _add(self, record: KeyRecord, actor: str | None) -> bool:
        """Store a new record and its audit record together; False if the id is taken."""
        hash_name = keys_key(record.project)
        added: builtins.list[bool] = [False]

        def update(pipe: redis.client.Pipeline) -> None:
            if pipe.hexists(hash_name, record.key_id):
                return  # a clash: nothing written, the caller mints another id
            prev = audit_log.head(pipe)
            pipe.multi()
            pipe.hset(hash_name, record.key_id, record.to_json())
            pipe.sadd(PROJECTS_KEY, record.project)
            fields = audit_record("key.create", record.project, actor, after=record.to_dict())
            audit_log.stage(pipe, fields, prev)
            added[0] = True

        with translated(self._location):
            self._redis.transaction(update, hash_name, audit_log.AUDIT_HEAD)
        return added[0]

    def get(self, project: str, key_id: str) -> KeyRecord | None:
        with translated(self._location):
            raw = cast(str | None, self._redis.hget(keys_key(project), key_id))
        return None if raw is None else KeyRecord.from_json(raw)

    def list(self, project: str) -> list[KeyRecord]:
        """``project``'s keys, oldest first. There is no key material to leak: none is stored."""
        with translated(self._location):
            raw = cast(dict[str, str], self._redis.hgetall(keys_key(project)))
        records = [KeyRecord.from_json(value) for value in raw.values()]
        return sorted(records, key=lambda r: (r.created_at or "", r.key_id))

    # `builtins.list`: inside this class, a bare `list` names the method above.
    def projects(self) -> builtins.list[str]:
        with translated(self._location):
            return sorted(cast(set[str], self._redis.smembers(PROJECTS_KEY)))

    def revoked_ids(self) -> builtins.list[str]:
        """Every revoked key id, of every project, sorted."""
        with translated(self._location):
            return sorted(cast(set[str], self._redis.smembers(REVOKED_KEY)))

    def revoke(
        self,
        project: str,
        key_or_id: str,
        *,
        ring: KeyRing | None = None,
        actor: str | None = None,
    ) -> KeyRecord:
        """Mark a key revoked and add its id to ``prism:revoked``; idempotent.

        ``key_or_id`` is a key id, or a full key: a full key is matched by its hash
        against the project's records. A full key that was minted offline (never
        registered) is accepted only if ``ring`` verifies it, and is then registered.
        Raises ``UnknownKeyError`` for an id the project does not have: revoking a
        mistyped id "successfully" would leave the real key working.
        """
        key_id = self._resolve(project, key_or_id.strip(), ring)
        hash_name = keys_key(project)
        revoked: builtins.list[KeyRecord] = []

        def update(pipe: redis.client.Pipeline) -> None:
            raw = cast(str | None, pipe.hget(hash_name, key_id))
            if raw is None:
                raise UnknownKeyError(f"project {project!r} has no key with id {key_id!r}")
            before = KeyRecord.from_json(raw)
            record = before
            if record.revoked_at is None:
                record = replace(record, revoked_at=_now())
            prev = audit_log.head(pipe)
            pipe.multi()
            # The record, the set and the audit log change together, so they never disagree.
            pipe.hset(hash_name, key_id, record.to_json())
            pipe.sadd(REVOKED_KEY, key_id)
            if record is not before:  # revoking again changes nothing worth a record
                fields = audit_record(
                    "key.revoke", project, actor, before=before.to_dict(), after=record.to_dict()
                )
                audit_log.stage(pipe, fields, prev)
            revoked[:] = [record]

        with translated(self._location):
            self._redis.transaction(update, hash_name, audit_log.AUDIT_HEAD)
        return revoked[0]

    def _resolve(self, project: str, key_or_id: str, ring: KeyRing | None) -> str:
        if not key_or_id.startswith("sk-"):
            if not _KEY_ID_RE.match(key_or_id):
                raise UnknownKeyError(
                    f"{key_or_id[:40]!r} is neither a key id (8-32 letters and digits) nor a key"
                )
            return key_or_id
        wanted = key_hash(key_or_id)
        for record in self.list(project):
            if record.key_hash == wanted:
                return record.key_id
        if ring is None:
            raise UnknownKeyError(
                f"that key is not registered in project {project!r}; if it was minted "
                "offline, set PRISM_KEY_SECRET so it can be verified, or check --project"
            )
        try:
            identity = ring.verify(key_or_id)
        except PrismError as error:
            raise UnknownKeyError(f"that is not a valid key: {error.message}") from None
        if identity.project != project:
            raise UnknownKeyError(
                f"that key belongs to project {identity.project!r}, not {project!r}"
            )
        # Minted offline with `prism keys mint`: register it now so it shows in `list`.
        record = KeyRecord(
            key_id=identity.key_id,
            project=project,
            version=identity.version,
            key_hash=wanted,
            prefix=_prefix(key_or_id, identity.key_id),
        )
        with translated(self._location):
            pipe = self._redis.pipeline(transaction=True)
            pipe.hsetnx(keys_key(project), record.key_id, record.to_json())
            pipe.sadd(PROJECTS_KEY, project)
            pipe.execute()
        return identity.key_id
