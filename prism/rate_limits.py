"""A project's rate limits (the policy's ``rate_limits``) and their compact Redis form.

In the policy record (canonical JSON, ``prism.policy``)::

    "rate_limits": {"project": {"rpm": 600, "tpm": 200000},
                    "key": {"rpm": 60, "tpm": 20000},
                    "keys": {"k3yId0001": {"rpm": 5}}}

``project`` limits every key of the project together; ``key`` limits each key of the
project on its own; ``keys`` overrides ``key`` for named key ids, field by field (an
override's ``rpm`` replaces ``key.rpm`` for that key; a field it leaves out falls back to
``key``). Every part and field is optional; at least one limit must be set.

The origin never parses this JSON on a request: the store writes the same limits as a
small hash next to the policy, ``prism:limits:{project}``, which the lookup script reads
(``rpm``, ``tpm``, ``key.rpm``, ``key.tpm``, ``id.{key_id}.rpm``, ``id.{key_id}.tpm``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["LIMITS_KEY_PREFIX", "MAX_RPM", "MAX_TPM", "Limit", "RateLimits", "limits_key"]

LIMITS_KEY_PREFIX = "prism:limits:"
MAX_RPM = 1_000_000
MAX_TPM = 1_000_000_000
MAX_OVERRIDES = 100
_KEY_ID_RE = re.compile(r"[A-Za-z0-9]{8,32}\Z")  # as prism.keys mints them
_PARTS = ("key", "keys", "project")


def limits_key(project: str) -> str:
    """The Redis hash holding ``project``'s limits in the lookup script's form."""
    return LIMITS_KEY_PREFIX + project


def _count(name: str, value: Any, most: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be a whole number (got {str(value)[:40]!r})")
    if not 1 <= value <= most:
        raise ValueError(f"{name}: must be between 1 and {most:,} (got {value})")
    return value


@dataclass(frozen=True, slots=True)
class Limit:
    """Requests and tokens per minute; None: not limited."""

    rpm: int | None = None
    tpm: int | None = None

    def __post_init__(self) -> None:
        _count("rpm", self.rpm, MAX_RPM)
        _count("tpm", self.tpm, MAX_TPM)

    @classmethod
    def from_dict(cls, name: str, data: Any) -> Limit:
        if not isinstance(data, dict):
            raise ValueError(f'{name}: must be an object like {{"rpm": 60, "tpm": 20000}}')
        for field in data:
            if field not in ("rpm", "tpm"):
                raise ValueError(f"{name}.{str(field)[:40]}: unknown field (known: rpm, tpm)")
        return cls(
            rpm=_count(f"{name}.rpm", data.get("rpm"), MAX_RPM),
            tpm=_count(f"{name}.tpm", data.get("tpm"), MAX_TPM),
        )

    def to_dict(self) -> dict[str, int]:
        out = {}
        if self.rpm is not None:
            out["rpm"] = self.rpm
        if self.tpm is not None:
            out["tpm"] = self.tpm
        return out

    def __bool__(self) -> bool:
        return self.rpm is not None or self.tpm is not None


_NONE = Limit()


@dataclass(frozen=True, slots=True)
class RateLimits:
    project: Limit = _NONE
    key: Limit = _NONE  # each key of the project
    keys: tuple[tuple[str, Limit], ...] = ()  # overrides of ``key`` by key id, sorted

    def __post_init__(self) -> None:
        if len(self.keys) > MAX_OVERRIDES:
            raise ValueError(f"rate_limits.keys: at most {MAX_OVERRIDES} key overrides")
        for key_id, limit in self.keys:
            if not _KEY_ID_RE.match(key_id):
                raise ValueError(
                    f"rate_limits.keys: {key_id[:40]!r} is not a key id (8-32 of A-Z a-z 0-9)"
                )
            if not limit:
                raise ValueError(f"rate_limits.keys.{key_id}: set rpm, tpm or both")
        object.__setattr__(self, "keys", tuple(sorted(dict(self.keys).items())))
        if not (self.project or self.key or self.keys):
            raise ValueError("rate_limits: set at least one limit (rpm or tpm)")

    @classmethod
    def from_dict(cls, data: Any) -> RateLimits:
        if not isinstance(data, dict):
            raise ValueError("rate_limits: must be an object with project, key and/or keys")
        for part in data:
            if part not in _PARTS:
                raise ValueError(
                    f"rate_limits.{str(part)[:40]}: unknown field (known: project, key, keys)"
                )
        overrides = data.get("keys", {})
        if not isinstance(overrides, dict):
            raise ValueError('rate_limits.keys: must be an object like {"<key id>": {"rpm": 5}}')
        return cls(
            project=Limit.from_dict("rate_limits.project", data.get("project", {})),
            key=Limit.from_dict("rate_limits.key", data.get("key", {})),
            keys=tuple(
                (str(key_id), Limit.from_dict(f"rate_limits.keys.{str(key_id)[:40]}", limit))
                for key_id, limit in overrides.items()
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.project:
            out["project"] = self.project.to_dict()
        if self.key:
            out["key"] = self.key.to_dict()
        if self.keys:
            out["keys"] = {key_id: limit.to_dict() for key_id, limit in self.keys}
        return out

    def for_key(self, key_id: str) -> Limit:
        """The per-key limit that holds for ``key_id`` (its override over ``key``)."""
        for named, limit in self.keys:
            if named == key_id:
                return Limit(
                    limit.rpm if limit.rpm is not None else self.key.rpm,
                    limit.tpm if limit.tpm is not None else self.key.tpm,
                )
        return self.key

    def limits_tokens(self, key_id: str) -> bool:
        """Whether a tokens-per-minute limit applies to ``key_id``'s requests."""
        return self.project.tpm is not None or self.for_key(key_id).tpm is not None

    def hash_fields(self) -> dict[str, str]:
        """The compact form the origin's lookup script reads (``limits_key``)."""
        fields: dict[str, str] = {}
        for prefix, limit in (("", self.project), ("key.", self.key)):
            for name, value in limit.to_dict().items():
                fields[prefix + name] = str(value)
        for key_id, limit in self.keys:
            for name, value in limit.to_dict().items():
                fields[f"id.{key_id}.{name}"] = str(value)
        return fields

    def describe(self) -> str:
        def one(limit: Limit) -> str:
            parts = [
                f"{limit.rpm:,} rpm" if limit.rpm else "",
                f"{limit.tpm:,} tpm" if limit.tpm else "",
            ]
            return " and ".join(p for p in parts if p)

        parts = []
        if self.project:
            parts.append(f"project {one(self.project)}")
        if self.key:
            parts.append(f"each key {one(self.key)}")
        parts.extend(f"key {key_id} {one(limit)}" for key_id, limit in self.keys)
        return "; ".join(parts)
