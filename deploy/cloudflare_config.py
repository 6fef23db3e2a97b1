"""What an edge deploy to Cloudflare needs, validated once (:class:`EdgeDeployConfig`): the
account, token, origin URL, secrets, Worker name and routes, and which wrangler runs it
(:func:`find_wrangler`); and the two errors every step of the deploy raises.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from deploy.edge_bundle import load_wrangler_config
from edge.origins import parse_origins
from prism import parse_key_secrets
from prism.routes import CLOUDFLARE_API_URL

__all__ = [
    "DEFAULT_API_URL",
    "DEFAULT_NAMESPACE_TITLE",
    "EDGE_SECRETS",
    "EdgeConfigError",
    "EdgeDeployConfig",
    "EdgeDeployError",
    "WorkerRoute",
    "find_wrangler",
]

DEFAULT_API_URL = CLOUDFLARE_API_URL
DEFAULT_NAMESPACE_TITLE = "prism-cache"
EDGE_SECRETS = ("PRISM_KEY_SECRET", "PRISM_FORWARD_SECRET")
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
_WORKER_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
_ACCOUNT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")  # a path segment of the API


class EdgeConfigError(ValueError):
    """Bad or missing input (exit code 2)."""


class EdgeDeployError(RuntimeError):
    """The Cloudflare API or wrangler failed (exit code 1); the message is one safe line."""


@dataclass(frozen=True, slots=True)
class WorkerRoute:
    """A Worker route: ``pattern``, in ``zone_name`` or the zone wrangler finds from its host."""

    pattern: str
    zone_name: str | None = None

    @classmethod
    def parse(cls, text: str) -> WorkerRoute:
        """``gw.example.com/*`` or ``gw.example.com/*@example.com`` (pattern @ zone name)."""
        text = text.strip()
        pattern, zone = text, None
        head, sep, tail = text.rpartition("@")
        # A path may contain "@"; only a trailing domain-like part is a zone.
        if sep and head and tail and not any(c in tail for c in "/*:"):
            pattern, zone = head, tail
        if not pattern or any(c.isspace() for c in pattern):
            raise EdgeConfigError(f"invalid route {text!r}: expected PATTERN or PATTERN@ZONE")
        if zone is not None and "." not in zone:
            raise EdgeConfigError(f"invalid zone {zone!r} in route {text!r}")
        return cls(pattern, zone)

    def to_wrangler(self) -> dict[str, Any]:
        # Always a table: the bundle's TOML writer cannot mix strings and tables in one
        # array, and `custom_domain = false` is wrangler's spelling of "zone from host".
        if self.zone_name:
            return {"pattern": self.pattern, "zone_name": self.zone_name}
        return {"pattern": self.pattern, "custom_domain": False}

    def __str__(self) -> str:
        return f"{self.pattern}@{self.zone_name}" if self.zone_name else self.pattern


@dataclass(frozen=True, slots=True)
class EdgeDeployConfig:
    """Everything a deploy needs, validated once; secrets and token stay out of ``repr``."""

    account_id: str
    api_token: str = field(repr=False)
    origin_url: str
    secrets: Mapping[str, str] = field(repr=False)
    namespace_title: str = DEFAULT_NAMESPACE_TITLE
    name: str = "prism-edge"
    routes: tuple[WorkerRoute, ...] = ()
    api_url: str = DEFAULT_API_URL
    #: argv prefix of wrangler (or pywrangler); empty: :func:`find_wrangler` at run time.
    wrangler: tuple[str, ...] = ()
    #: A plan only: no token needed, and the account id may be left out.
    dry_run: bool = False
    #: The edge's ``PRISM_ORIGINS`` binding (``region=url,...``; edge/origins.py), if any.
    origins: str = ""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not _ACCOUNT_ID.match(self.account_id) and (self.account_id or not self.dry_run):
            problems.append(f"invalid account id {self.account_id!r}")
        if not self.api_token.strip() and not self.dry_run:
            problems.append("CLOUDFLARE_API_TOKEN is empty")
        if not self.namespace_title.strip():
            problems.append("the KV namespace title is empty")
        if not _WORKER_NAME.match(self.name):
            problems.append(
                f"invalid Worker name {self.name!r} (lowercase letters, digits and dashes, "
                "at most 63, no dash at either end)"
            )
        if urlsplit(self.api_url).scheme not in ("http", "https"):
            problems.append(f"invalid API URL {self.api_url!r}")
        problems.extend(_origin_url_problems(self.origin_url))
        try:
            for origin in parse_origins(self.origins, None):
                problems.extend(_origin_url_problems(origin.url))
        except ValueError as error:
            problems.append(str(error))
        missing = [name for name in EDGE_SECRETS if not self.secrets.get(name)]
        if missing:
            problems.append(f"missing secret(s): {', '.join(missing)}")
        else:
            try:
                parse_key_secrets(self.secrets["PRISM_KEY_SECRET"])
            except ValueError as error:
                problems.append(f"invalid PRISM_KEY_SECRET: {error}")
        if problems:
            raise EdgeConfigError("; ".join(problems))
        # Frozen means frozen: nobody mutates the secrets after validation.
        secrets = {name: self.secrets[name] for name in EDGE_SECRETS}
        object.__setattr__(self, "secrets", MappingProxyType(secrets))
        object.__setattr__(self, "origin_url", self.origin_url.rstrip("/"))

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        *,
        account_id: str | None = None,
        origin_url: str | None = None,
        namespace_title: str | None = None,
        name: str | None = None,
        routes: Sequence[str] = (),
        wrangler: Sequence[str] | None = None,
        dry_run: bool = False,
    ) -> EdgeDeployConfig:
        """Read the token, account, origin URL, secrets and API URL from ``environ``
        (a dry run needs neither the token nor the account)."""
        account = account_id or environ.get("CLOUDFLARE_ACCOUNT_ID", "")
        origin = origin_url or environ.get("PRISM_ORIGIN_URL", "")
        needed = [
            ("CLOUDFLARE_API_TOKEN", environ.get("CLOUDFLARE_API_TOKEN")),
            ("--account-id (or CLOUDFLARE_ACCOUNT_ID)", account),
        ]
        missing = [
            label
            for label, value in (
                *([] if dry_run else needed),
                ("--origin-url (or PRISM_ORIGIN_URL)", origin),
                *((secret, environ.get(secret)) for secret in EDGE_SECRETS),
            )
            if not value
        ]
        if missing:
            raise EdgeConfigError(f"missing {', '.join(missing)}")
        command = tuple(wrangler) if wrangler is not None else find_wrangler(environ)
        return cls(
            account_id=account.strip(),
            api_token=environ.get("CLOUDFLARE_API_TOKEN", "").strip(),
            origin_url=origin.strip(),
            secrets={name: environ[name] for name in EDGE_SECRETS},
            namespace_title=(namespace_title or DEFAULT_NAMESPACE_TITLE).strip(),
            name=name or str(load_wrangler_config().get("name") or "prism-edge"),
            routes=tuple(WorkerRoute.parse(route) for route in routes),
            api_url=environ.get("PRISM_CLOUDFLARE_API_URL") or DEFAULT_API_URL,
            wrangler=command,
            dry_run=dry_run,
        )

    def masked(self, text: str) -> str:
        """``text`` with the token and every secret value replaced by ``***``."""
        for value in (self.api_token, *self.secrets.values()):
            if len(value) >= 4:
                text = text.replace(value, "***")
        return text


def _origin_url_problems(url: str) -> list[str]:
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        return [f"invalid origin URL {url!r}: expected https://HOST"]
    if parts.username or parts.password:
        return ["the origin URL must not contain credentials (it is a plain Worker var)"]
    if parts.scheme == "http" and host not in _LOCAL_HOSTS:
        return [f"the origin URL must use https (http only for 127.0.0.1/localhost): {url}"]
    return []


def find_wrangler(
    environ: Mapping[str, str] | None = None, *, search_from: Sequence[Path] | None = None
) -> tuple[str, ...]:
    """The wrangler command: ``$PRISM_WRANGLER``, else ``pywrangler`` if installed, else
    the repo's pinned ``node_modules/.bin/wrangler`` (walking up from the working
    directory and from this file)."""
    environ = os.environ if environ is None else environ
    if override := environ.get("PRISM_WRANGLER", "").strip():
        return tuple(shlex.split(override))
    beside_python = Path(sys.executable).parent / "pywrangler"
    pywrangler = shutil.which("pywrangler", path=environ.get("PATH")) or (
        str(beside_python) if os.access(beside_python, os.X_OK) else None
    )
    if pywrangler:
        return (pywrangler,)
    starts = search_from if search_from is not None else (Path.cwd(), Path(__file__).parent)
    for start in starts:
        start = start.resolve()
        for folder in (start, *start.parents):
            candidate = folder / "node_modules" / ".bin" / "wrangler"
            if os.access(candidate, os.X_OK):
                return (str(candidate),)
    raise EdgeConfigError(
        "wrangler not found: run `npm ci` in the repository (package.json pins wrangler "
        "3.91.0), install pywrangler, or set PRISM_WRANGLER"
    )
