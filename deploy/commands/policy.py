"""`prism policy`: set, show, clear and publish a project's model policy.

The logic lives in deploy.policy_store (and the policy itself in prism.policy); this
module only parses options and prints. Publishing to Workers KV reuses `prism keys`'s
publisher and options.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from deploy.key_store import DEFAULT_REDIS_URL
from deploy.policy_store import PolicyChange, PolicyStore, check_project, sync_policy
from deploy.revocation_publisher import DEFAULT_KV_API
from deploy.store_errors import KeyStoreError
from prism import (
    BUDGET_PERIODS,
    Budget,
    CacheRules,
    Limit,
    LogRules,
    Policy,
    RateLimits,
    policy_key,
)
from prism.policy import (
    DEFAULT_SEMANTIC_THRESHOLD,
    MAX_SEMANTIC_THRESHOLD,
    MIN_SEMANTIC_THRESHOLD,
)
from prism.rate_limits import MAX_RPM, MAX_TPM

from ._options import JsonOption
from .keys import (
    KVAccountOption,
    KVApiOption,
    KVNamespaceOption,
    KVTokenOption,
    NoKVOption,
    ProjectOption,
    RedisUrlOption,
    default_user,
    fail,
    kv_publisher,
)

__all__ = ["app"]

app = typer.Typer(
    name="policy", help="Set and show each project's model policy.", no_args_is_help=True
)

PROPAGATION = (
    "origin: enforced from now on (it reads the policy with every request).\n"
    "edge:   every PoP enforces it within about a minute (each isolate re-reads a project's "
    "policy at most once a minute) plus Workers KV propagation (up to about a minute more)."
)


@contextmanager
def open_store(redis_url: str, project: str) -> Iterator[PolicyStore]:
    """A PolicyStore for the command; bad input exits 2, store failures exit 1."""
    try:
        check_project(project)
        store = PolicyStore.from_url(redis_url)
    except ValueError as error:
        raise fail(str(error), 2) from None
    try:
        yield store
    except KeyStoreError as error:
        raise fail(str(error)) from None
    finally:
        store.close()


def _describe(policy: Policy | None) -> str:
    if policy is None:
        return "none (every model is allowed)"
    allow = ", ".join(policy.allow) or "every model"
    deny = ", ".join(policy.deny) or "nothing"
    budget = policy.budget
    spend = f"; budget ${budget.usd:,} per UTC {budget.period}" if budget else ""
    cache = policy.cache
    semantic = (
        f"; semantic cache on (threshold {cache.threshold})" if cache and cache.semantic else ""
    )
    limits = "" if policy.rate_limits is None else f"; rate limits {policy.rate_limits.describe()}"
    log = policy.log
    bodies = ""
    if log is not None and log.bodies:
        bodies = "; bodies logged (redacted" + (", emails too)" if log.redact_emails else ")")
    return (
        f"allow {allow}; deny {deny}{spend}{semantic}{limits}{bodies} (revision {policy.revision})"
    )


def _as_dict(policy: Policy | None) -> dict[str, object] | None:
    return None if policy is None else policy.to_dict()


def _publish(
    store: PolicyStore,
    project: str,
    change: PolicyChange,
    kv: tuple[str, str, str, str],
    no_kv: bool,
    as_json: bool,
) -> None:
    """Tell the edge, print the outcome, and exit 1 when the edge could not be told."""
    problem: str | None = None
    if not no_kv:
        api_url, account_id, namespace_id, token = kv
        publisher = kv_publisher(api_url, account_id, namespace_id, token, policy_key(project))
        if publisher is None:
            problem = "PRISM_KV_ACCOUNT_ID / PRISM_KV_NAMESPACE_ID are not set (or pass --no-kv)"
        elif not sync_policy(store, project, publisher):
            problem = f"Workers KV write failed: {publisher.last_error}"
    before, after = change
    if as_json:
        edge = {"published": problem is None and not no_kv, "skipped": no_kv, "error": problem}
        typer.echo(
            json.dumps(
                {
                    "project": project,
                    "before": _as_dict(before),
                    "after": _as_dict(after),
                    "edge": edge,
                }
            )
        )
    else:
        typer.echo(f"Policy of project {project}: {_describe(after)}.")
        typer.echo(PROPAGATION if not no_kv else PROPAGATION.splitlines()[0])
    if problem is not None:
        typer.echo(
            f"Warning: saved in Redis (the origin enforces it now), but the edge was not "
            f"told: {problem}. Run `prism policy sync --project {project}` to publish it.",
            err=True,
        )
        raise typer.Exit(1)


# -- rate limits: their options, and the RateLimits they make --------------------------

RpmOption = Annotated[
    int | None, typer.Option("--rpm", help="Requests per minute for the whole project.")
]
TpmOption = Annotated[
    int | None, typer.Option("--tpm", help="Tokens per minute for the whole project.")
]
KeyRpmOption = Annotated[
    int | None, typer.Option("--key-rpm", help="Requests per minute for each key of the project.")
]
KeyTpmOption = Annotated[
    int | None, typer.Option("--key-tpm", help="Tokens per minute for each key of the project.")
]
KeyLimitOption = Annotated[
    list[str] | None,
    typer.Option(
        "--key-limit",
        help="One key's own limits, over --key-rpm/--key-tpm: KEY_ID:rpm=N[,tpm=N] (repeatable).",
    ),
]


def _key_limit(spec: str) -> tuple[str, Limit]:
    key_id, sep, rest = spec.partition(":")
    values: dict[str, object] = {}
    for part in rest.split(",") if sep else ():
        name, eq, number = part.partition("=")
        if not eq or not number.strip().isdigit():
            break
        values[name.strip()] = int(number)
    else:
        if values:
            return key_id, Limit.from_dict(f"--key-limit {key_id[:40]}", values)
    raise ValueError(f"--key-limit: {spec[:60]!r} is not KEY_ID:rpm=N[,tpm=N]")


def rate_limits_option(
    rpm: int | None,
    tpm: int | None,
    key_rpm: int | None,
    key_tpm: int | None,
    key_limits: list[str] | None,
) -> RateLimits | None:
    """The rate limits the options set (None: none given); ``ValueError`` for bad input."""
    given = (rpm, tpm, key_rpm, key_tpm)
    if all(v is None for v in given) and not key_limits:
        return None
    for flag, value in zip(("--rpm", "--tpm", "--key-rpm", "--key-tpm"), given, strict=True):
        most = MAX_RPM if flag.endswith("rpm") else MAX_TPM
        if value is not None and not 1 <= value <= most:
            raise ValueError(f"{flag}: must be between 1 and {most:,} (got {value})")
    return RateLimits(
        project=Limit(rpm, tpm),
        key=Limit(key_rpm, key_tpm),
        keys=tuple(_key_limit(spec) for spec in key_limits or ()),
    )


@app.command("set")
def set_policy(
    project: ProjectOption,
    allow: Annotated[
        list[str] | None,
        typer.Option(
            "--allow", help="Model glob the project may use (repeatable). [default: every model]"
        ),
    ] = None,
    deny: Annotated[
        list[str] | None,
        typer.Option("--deny", help="Model glob the project may not use (repeatable; wins)."),
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            help="Most the project may spend per period, in USD (e.g. 25 or 0.50). "
            "[default: no budget]",
        ),
    ] = None,
    period: Annotated[
        str | None,
        typer.Option("--period", help="The budget's UTC period: day or month. [default: month]"),
    ] = None,
    updated_by: Annotated[
        str | None,
        typer.Option("--by", help="Recorded with the change. [default: your login name]"),
    ] = None,
    # -- the semantic cache (cache.semantic / cache.threshold) --
    semantic: Annotated[
        bool | None,
        typer.Option(
            "--semantic/--no-semantic",
            help="Answer paraphrases of cached questions from their answers (the origin's "
            "semantic cache). [default: off]",
        ),
    ] = None,
    semantic_threshold: Annotated[
        float | None,
        typer.Option(
            "--semantic-threshold",
            help=f"Least similarity a paraphrase needs ({MIN_SEMANTIC_THRESHOLD}-"
            f"{MAX_SEMANTIC_THRESHOLD}). [default: {DEFAULT_SEMANTIC_THRESHOLD}, measured by "
            "`prism bench semantic`]",
        ),
    ] = None,
    # -- the request log (log.bodies / log.redact_emails) --
    log_bodies: Annotated[
        bool,
        typer.Option(
            "--log-bodies",
            help="Keep each request's prompt and answer in its request-log record, common "
            "secrets (API keys, AWS keys, bearer tokens, JWTs) redacted. [default: off]",
        ),
    ] = False,
    redact_emails: Annotated[
        bool,
        typer.Option("--redact-emails", help="With --log-bodies: redact email addresses too."),
    ] = False,
    # -- rate limits (rate_limits) --
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    key_rpm: KeyRpmOption = None,
    key_tpm: KeyTpmOption = None,
    key_limit: KeyLimitOption = None,
    redis_url: RedisUrlOption = DEFAULT_REDIS_URL,
    kv_api_url: KVApiOption = DEFAULT_KV_API,
    kv_account_id: KVAccountOption = "",
    kv_namespace_id: KVNamespaceOption = "",
    api_token: KVTokenOption = "",
    no_kv: NoKVOption = False,
    as_json: JsonOption = False,
) -> None:
    """Replace PROJECT's policy (models, budget, semantic cache, rate limits): at once at
    the origin, within ~2 min at the edge.

    Patterns are case-sensitive globs (*, ?, [...]). A model is allowed when no --deny
    matches it and --allow is empty or one --allow matches it. A refused model is a
    403 `model_not_allowed`. --budget caps the provider cost of the whole project per
    UTC --period; a request that does not fit is a 429 `budget_exceeded`. The whole
    policy is replaced: give every part you want kept. An invalid policy changes nothing.

    --semantic answers paraphrases of questions the project already asked from their
    cached answers (the origin's semantic cache), at --semantic-threshold.

    --log-bodies keeps each request's prompt and answer in its request-log record (`prism
    logs --id`), redacted of common secrets (and of emails with --redact-emails).

    --rpm/--tpm limit the whole project's requests/tokens per minute, --key-rpm/--key-tpm
    each key's, --key-limit one key's own; a request over a limit is a 429
    `rate_limit_exceeded`.

    Example: prism policy set --project acme --allow 'gpt-4o*' --deny 'o1*' --budget 25 --period day
    Example: prism policy set --project acme --allow 'gpt-4o*' --semantic
    Example: prism policy set --project acme --rpm 600 --tpm 200000 --key-rpm 60
    """
    try:
        rates = rate_limits_option(rpm, tpm, key_rpm, key_tpm, key_limit)
    except ValueError as error:
        raise fail(f"invalid policy: {error}", 2) from None
    if redact_emails and not log_bodies:
        raise fail("--redact-emails needs --log-bodies", 2)
    if (
        not allow
        and not deny
        and budget is None
        and not semantic
        and rates is None
        and not log_bodies
    ):
        raise fail(
            "give at least one --allow, --deny or --budget, or --semantic, or a rate limit "
            "option, or --log-bodies (`prism policy clear` removes it)",
            2,
        )
    limit = _budget(budget, period)
    cache = _semantic_cache(semantic, semantic_threshold)
    with open_store(redis_url, project) as store:
        try:
            change = store.set(
                project,
                allow=allow or (),
                deny=deny or (),
                budget=limit,
                rate_limits=rates,
                updated_by=updated_by or default_user(),
                cache=cache,
                log=LogRules(bodies=True, redact_emails=redact_emails) if log_bodies else None,
            )
        except ValueError as error:
            raise fail(f"invalid policy: {error}", 2) from None
        _publish(
            store,
            project,
            change,
            (kv_api_url, kv_account_id, kv_namespace_id, api_token),
            no_kv,
            as_json,
        )


def _semantic_cache(semantic: bool | None, threshold: float | None) -> CacheRules | None:
    """The cache options the flags give; exits 2 saying what is wrong."""
    if not semantic:
        if threshold is not None:
            raise fail("--semantic-threshold needs --semantic", 2)
        return None
    try:
        return CacheRules(True, DEFAULT_SEMANTIC_THRESHOLD if threshold is None else threshold)
    except ValueError as error:
        raise fail(f"invalid policy: {error}", 2) from None


def _budget(usd: str | None, period: str | None) -> Budget | None:
    """The budget the options give; exits 2 saying what is wrong."""
    if usd is None:
        if period is not None:
            raise fail("--period needs --budget (the USD amount per period)", 2)
        return None
    try:
        amount = float(usd.strip().removeprefix("$").replace(",", ""))
    except ValueError:
        message = f"invalid policy: --budget must be a number of US dollars, got {usd!r}"
        raise fail(message, 2) from None
    if period is not None and period not in BUDGET_PERIODS:
        raise fail(f"invalid policy: --period must be {' or '.join(BUDGET_PERIODS)}", 2)
    try:
        return Budget(usd=amount, period=period or "month")
    except ValueError as error:
        raise fail(f"invalid policy: {error}", 2) from None


@app.command("show")
def show(
    project: ProjectOption,
    redis_url: RedisUrlOption = DEFAULT_REDIS_URL,
    as_json: JsonOption = False,
) -> None:
    """Show PROJECT's model policy (from Redis, the source of truth).

    Example: prism policy show --project acme
    """
    with open_store(redis_url, project) as store:
        policy = store.get(project)
    if as_json:
        typer.echo(json.dumps({"project": project, "policy": _as_dict(policy)}))
        return
    typer.echo(f"Policy of project {project}: {_describe(policy)}.")
    if policy is not None:
        typer.echo(f"Updated {policy.updated_at or '?'} by {policy.updated_by or '?'}.")


@app.command("clear")
def clear(
    project: ProjectOption,
    updated_by: Annotated[
        str | None,
        typer.Option("--by", help="Recorded with the change. [default: your login name]"),
    ] = None,
    redis_url: RedisUrlOption = DEFAULT_REDIS_URL,
    kv_api_url: KVApiOption = DEFAULT_KV_API,
    kv_account_id: KVAccountOption = "",
    kv_namespace_id: KVNamespaceOption = "",
    api_token: KVTokenOption = "",
    no_kv: NoKVOption = False,
    as_json: JsonOption = False,
) -> None:
    """Remove PROJECT's model policy: every model is allowed again.

    Example: prism policy clear --project acme
    """
    with open_store(redis_url, project) as store:
        change = store.clear(project, actor=updated_by or default_user())
        _publish(
            store,
            project,
            change,
            (kv_api_url, kv_account_id, kv_namespace_id, api_token),
            no_kv,
            as_json,
        )


@app.command("sync")
def sync(
    project: ProjectOption,
    redis_url: RedisUrlOption = DEFAULT_REDIS_URL,
    kv_api_url: KVApiOption = DEFAULT_KV_API,
    kv_account_id: KVAccountOption = "",
    kv_namespace_id: KVNamespaceOption = "",
    api_token: KVTokenOption = "",
) -> None:
    """Publish PROJECT's policy from Redis to Workers KV again (after a failed KV write).

    Example: prism policy sync --project acme
    """
    with open_store(redis_url, project) as store:
        policy = store.get(project)
        _publish(
            store,
            project,
            (policy, policy),
            (kv_api_url, kv_account_id, kv_namespace_id, api_token),
            no_kv=False,
            as_json=False,
        )
