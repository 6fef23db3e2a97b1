"""`prism audit`: read, follow and verify the tamper-evident audit log
(origin/governance/audit.py)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated

import redis
import typer

from deploy import audit_log
from deploy.key_store import DEFAULT_REDIS_URL
from deploy.policy_store import check_project
from deploy.store_errors import redact_url

from ._options import JsonOption
from .keys import RedisUrlOption, fail

__all__ = ["audit_command"]


def _summary(fields: dict[str, str]) -> str:
    def loads(text: str) -> dict[str, object]:
        try:
            value = json.loads(text) if text else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    action = fields.get("action", "")
    after, before, detail = (loads(fields.get(n, "")) for n in ("after", "before", "detail"))
    if action.startswith("key."):
        return f"key {(after or before).get('key_id', '?')}"
    if action == "policy.set":
        budget = after.get("budget")
        spend = f"; budget ${budget['usd']}/{budget['period']}" if isinstance(budget, dict) else ""
        limits = after.get("rate_limits")
        rates = f"; rate limits {json.dumps(limits, sort_keys=True)}" if limits else ""
        allow, deny = after.get("allow") or "all", after.get("deny") or "none"
        return f"allow {allow}; deny {deny}{spend}{rates}"
    if action in ("policy.refuse", "budget.refuse"):
        return f"model {detail.get('model', '?')!r}: {detail.get('code', '?')}"
    if action == "ratelimit.refuse":
        within = detail.get("within_seconds")
        when = f" in the {within:g} s after the first" if isinstance(within, float | int) else ""
        return (
            f"{detail.get('count', '?')} x over the {detail.get('scope', '?')} "
            f"{detail.get('kind', '?')} limit{when}"
        )
    return ""


def _show(records: Iterable[tuple[str, dict[str, str]]], project: str | None, as_json: bool) -> str:
    last = "-"
    for record_id, fields in records:
        last = record_id
        if project is not None and fields.get("project") != project:
            continue
        if as_json:
            typer.echo(json.dumps({"id": record_id, **fields}))
        else:
            typer.echo(
                f"{fields.get('ts', '?')}  {fields.get('action', '?'):<13}  "
                f"{fields.get('project', '?')}  {fields.get('actor', '?')}  {_summary(fields)}"
            )
    return last


def audit_command(
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Only this project's records.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing records as they arrive.")
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify", help="Check the whole hash chain; exit 1 naming the first bad record."
        ),
    ] = False,
    redis_url: RedisUrlOption = DEFAULT_REDIS_URL,
    as_json: JsonOption = False,
) -> None:
    """Show the audit log: every key and policy change (who, when, before and after) and
    every policy refusal at the origin, oldest first.

    Each record carries the hash of the one before it, so `--verify` detects a record
    changed, inserted or deleted by hand.

    Example: prism audit --project acme --verify
    """
    if follow and verify:
        raise fail("--follow and --verify do not go together", 2)
    try:
        if project is not None:
            check_project(project)
        client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=10)
    except ValueError as error:
        raise fail(str(error), 2) from None
    try:
        if verify:
            _verify(client, as_json)
            return
        last = _show(audit_log.read(client), project, as_json)
        if follow:
            _show(audit_log.follow(client, last), project, as_json)
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise fail(f"cannot reach Redis at {redact_url(redis_url)}: {error}") from None
    except redis.RedisError as error:
        raise fail(f"Redis at {redact_url(redis_url)} failed: {error}") from None
    except KeyboardInterrupt:
        pass
    finally:
        client.close()


def _verify(client: redis.Redis, as_json: bool) -> None:
    count, broken = audit_log.verify(client)
    if as_json:
        problem = None if broken is None else {"id": broken.record_id, "reason": broken.reason}
        typer.echo(json.dumps({"intact": broken is None, "records": count, "broken": problem}))
    elif broken is None:
        typer.echo(f"Audit log intact: {count} record(s), every hash and link checks out.")
    if broken is not None:
        if not as_json:
            typer.echo(
                f"Audit log BROKEN at record {broken.record_id or '(end)'}: {broken.reason} "
                f"({count} record(s) before it check out).",
                err=True,
            )
        raise typer.Exit(1)
