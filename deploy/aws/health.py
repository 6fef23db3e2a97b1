"""The pre-traffic health check: does a new origin instance answer ``/healthz`` with its release?

The deployer dials the new instance's own public address over HTTPS before the
Elastic IP (and so the domain) points at it. Its certificate cannot be a public
one yet, so the check sends :data:`~deploy.aws.userdata.HEALTH_HOST` as SNI and
Host (Caddy serves that name with ``tls internal``) and does not verify the
chain: what it proves is that Caddy and the origin run the expected release.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from deploy.aws.userdata import HEALTH_HOST

__all__ = ["DEFAULT_DEADLINE", "check_health", "probe"]

# A first boot installs apt packages and the release before the origin answers.
DEFAULT_DEADLINE = 15 * 60.0
_INTERVAL = 10.0


def probe(client: httpx.Client, address: str, release: str) -> str | None:
    """One request: None when healthy with ``release``, else what is wrong."""
    try:
        response = client.get(
            f"https://{address}/healthz",
            headers={"Host": HEALTH_HOST},
            extensions={"sni_hostname": HEALTH_HOST},
        )
    except httpx.HTTPError as error:
        return f"https://{address}/healthz: {type(error).__name__}: {error}".rstrip(": ")
    if response.status_code != 200:
        return f"/healthz answered {response.status_code}: {response.text[:200]}"
    try:
        body = response.json()
    except ValueError:
        return "/healthz did not answer JSON"
    if not isinstance(body, dict) or body.get("status") != "ok":
        status = body.get("status") if isinstance(body, dict) else body
        return f"/healthz status is {status!r}, not 'ok'"
    if body.get("version") != release:
        return f"/healthz reports version {body.get('version')!r}, expected {release!r}"
    return None


def check_health(
    address: str,
    release: str,
    *,
    deadline: float = DEFAULT_DEADLINE,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str | None:
    """Poll until ``address`` is healthy with ``release`` (None) or ``deadline`` s pass (why)."""
    end = clock() + deadline
    with httpx.Client(verify=False, timeout=10.0) as client:  # unverifiable here: see the docstring
        while True:
            problem = probe(client, address, release)
            if problem is None or clock() >= end:
                return problem
            sleep(_INTERVAL)
