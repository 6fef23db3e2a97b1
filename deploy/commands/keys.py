"""`prism keys`: mint and verify keys offline; create, revoke and list managed keys.

`mint`/`verify` need only PRISM_KEY_SECRET. `create`/`revoke`/`list`/`sync` keep key
metadata (never keys) in Redis and publish revocations to the edge's Workers KV set;
the logic lives in deploy.key_store and deploy.revocation_publisher, this module only
parses options and prints.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from deploy.key_store import DEFAULT_REDIS_URL, KeyRecord, KeyStore
from deploy.revocation_publisher import DEFAULT_KV_API, KVRevocationPublisher, sync_revocations
from deploy.store_errors import KeyStoreError
from prism import REVOKED_KEY, KeyRing, PrismError, parse_key_secrets

from ._options import JsonOption

__all__ = ["app", "default_user", "fail"]

app = typer.Typer(name="keys", help="Mint, verify and manage Prism API keys.", no_args_is_help=True)

SecretOption = Annotated[
    str,
    typer.Option(
        "--secret",
        envvar="PRISM_KEY_SECRET",
        help="Signing secret(s): 'SECRET' or 'VERSION:SECRET,VERSION:SECRET' while rotating.",
        show_default=False,
        show_envvar=True,
    ),
]


def key_ring(secret: str) -> KeyRing:
    """The key ring from a secret option, or a one-line error and exit 2."""
    try:
        return parse_key_secrets(secret)
    except ValueError as error:
        typer.echo(f"Error: PRISM_KEY_SECRET: {error}", err=True)
        raise typer.Exit(2) from None


@app.command("mint")
def mint(
    project: Annotated[str, typer.Option("--project", "-p", help="Project id the key belongs to.")],
    secret: SecretOption,
    as_json: JsonOption = False,
) -> None:
    """Print a new API key for PROJECT, signed offline with PRISM_KEY_SECRET.

    The key is not recorded anywhere: use `prism keys create` to also register it
    (so it can be listed and revoked).

    Example: PRISM_KEY_SECRET=... prism keys mint --project acme
    """
    ring = key_ring(secret)
    try:
        key = ring.mint(project)
    except ValueError as error:
        typer.echo(f"Error: {error}", err=True)
        raise typer.Exit(2) from None
    identity = ring.verify(key)
    if as_json:
        typer.echo(json.dumps({"key": key, "project": project, "key_id": identity.key_id}))
    else:
        typer.echo(key)


@app.command("verify")
def verify(
    key: Annotated[str, typer.Argument(help="The API key to check.", show_default=False)],
    secret: SecretOption,
    as_json: JsonOption = False,
) -> None:
    """Check a key's signature offline; print its project id (exit 0) or the reason (exit 1).

    Example: prism keys verify sk-prism-v1.acme.0123abcd4567ef89.Xy...
    """
    ring = key_ring(secret)
    try:
        identity = ring.verify(key.strip())
    except PrismError as error:
        if as_json:
            typer.echo(json.dumps({"valid": False, "code": error.code, "reason": error.message}))
        else:
            typer.echo(f"invalid: {error.message}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "valid": True,
                    "project": identity.project,
                    "key_id": identity.key_id,
                    "version": identity.version,
                }
            )
        )
    else:
        typer.echo(identity.project)


# ----------------------------------------------------------------------------- managed keys

RedisUrlOption = Annotated[
    str,
    typer.Option(
        "--redis-url", envvar="REDIS_URL", show_envvar=True, help="Redis holding key metadata."
    ),
]
ProjectOption = Annotated[
    str, typer.Option("--project", "-p", help="Project id.", show_default=False)
]
KVApiOption = Annotated[
    str,
    typer.Option("--kv-api-url", envvar="PRISM_KV_API_URL", show_envvar=True, help="KV REST API."),
]
KVAccountOption = Annotated[
    str,
    typer.Option(
        "--kv-account-id",
        envvar="PRISM_KV_ACCOUNT_ID",
        show_envvar=True,
        show_default=False,
        help="Cloudflare account id of the KV namespace.",
    ),
]
KVNamespaceOption = Annotated[
    str,
    typer.Option(
        "--kv-namespace-id",
        envvar="PRISM_KV_NAMESPACE_ID",
        show_envvar=True,
        show_default=False,
        help="Workers KV namespace the edge reads.",
    ),
]
KVTokenOption = Annotated[
    str,
    typer.Option(
        "--cloudflare-api-token",
        envvar="CLOUDFLARE_API_TOKEN",
        show_envvar=True,
        show_default=False,
        help="API token with KV write access.",
    ),
]
NoKVOption = Annotated[
    bool,
    typer.Option(
        "--no-kv",
        help="Origin-only deployment: do not publish to Workers KV (there is no edge to tell).",
    ),
]

PROPAGATION = (
    "origin: refused from now on (it checks Redis on every request).\n"
    "edge:   every PoP refuses it within about a minute (each isolate re-reads the list at "
    "most once a minute) plus Workers KV propagation (up to about a minute more)."
)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one line to stderr; ``raise fail(...)`` to leave with ``code``."""
    typer.echo(f"Error: {message}", err=True)
    return typer.Exit(code)


@contextmanager
def open_store(redis_url: str) -> Iterator[KeyStore]:
    """A KeyStore for the command; its failures become one line and exit 1."""
    try:
        store = KeyStore.from_url(redis_url)
    except ValueError as error:
        raise fail(f"--redis-url / REDIS_URL: {error}", 2) from None
    try:
        yield store
    except KeyStoreError as error:
        raise fail(str(error)) from None
    finally:
        store.close()


def kv_publisher(
    api_url: str, account_id: str, namespace_id: str, api_token: str, key: str = REVOKED_KEY
) -> KVRevocationPublisher | None:
    """The publisher of one KV record (the revoked set unless ``key`` says another)."""
    if not (account_id and namespace_id):
        return None
    return KVRevocationPublisher(api_url, account_id, namespace_id, api_token, key=key)


def publish(
    store: KeyStore, publisher: KVRevocationPublisher | None, no_kv: bool
) -> tuple[bool, str | None]:
    """(published, why not). Never raises for KV: Redis already holds the truth."""
    if no_kv:
        return True, None
    if publisher is None:
        return False, "PRISM_KV_ACCOUNT_ID / PRISM_KV_NAMESPACE_ID are not set (or pass --no-kv)"
    if sync_revocations(store, publisher):
        return True, None
    return False, f"Workers KV write failed: {publisher.last_error}"


def default_user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in some containers
        return None


@app.command("create")
def create(
    project: ProjectOption,
    secret: SecretOption,
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="A label for humans, e.g. 'ci'.")
    ] = None,
    created_by: Annotated[
        str | None,
        typer.Option("--created-by", help="Recorded with the key. [default: your login name]"),
    ] = None,
    redis_url: RedisUrlOption = DEFAULT_REDIS_URL,
    as_json: JsonOption = False,
) -> None:
    """Create a key for PROJECT and register it (id, hash and prefix only) in Redis.

    The key is printed once, here; Prism keeps only its SHA-256, so it cannot be
    shown again. Lose it and you revoke it and create another.

    Example: prism keys create --project acme --name ci
    """
    ring = key_ring(secret)
    with open_store(redis_url) as store:
        try:
            created = store.create(
                ring, project, name=name, created_by=created_by or default_user()
            )
        except ValueError as error:
            raise fail(str(error), 2) from None
    warning = (
        f"Save this key now: it cannot be shown again (Prism stores only its hash). "
        f"Key id: {created.record.key_id}"
    )
    if as_json:
        typer.echo(json.dumps({"key": created.key, **created.record.to_dict()}))
    else:
        typer.echo(created.key)  # alone on stdout, so `KEY=$(prism keys create ...)` works
    typer.echo(warning, err=True)


@app.command("revoke")
def revoke(
    key_or_id: Annotated[
        str,
        typer.Argument(help="Key id, or the full key.", show_default=False),
    ],
    project: ProjectOption,
    secret: Annotated[
        str | None,
        typer.Option(
            "--secret",
            envvar="PRISM_KEY_SECRET",
            show_envvar=True,
            show_default=False,
            help="Only needed to revoke a full key that was minted offline (`mint`).",
        ),
    ] = None,
    redis_url: RedisUrlOption = DEFAULT_REDIS_URL,
    kv_api_url: KVApiOption = DEFAULT_KV_API,
    kv_account_id: KVAccountOption = "",
    kv_namespace_id: KVNamespaceOption = "",
    api_token: KVTokenOption = "",
    no_kv: NoKVOption = False,
    as_json: JsonOption = False,
) -> None:
    """Revoke a key: at once at the origin (Redis), within about a minute at the edge (KV).

    Redis is updated first and always; then the whole revoked-id list is written to
    Workers KV. If that write fails the origin still refuses the key, and this exits 1:
    run `prism keys sync` to publish the list again.

    Example: prism keys revoke 0123abcd4567ef89 --project acme
    """
    full_key = key_or_id.strip().startswith("sk-")
    ring = key_ring(secret) if full_key and secret else None
    with open_store(redis_url) as store:
        record = store.revoke(project, key_or_id, ring=ring, actor=default_user())
        published, problem = publish(
            store, kv_publisher(kv_api_url, kv_account_id, kv_namespace_id, api_token), no_kv
        )
    label = f" ({record.name})" if record.name else ""
    if as_json:
        edge = {"published": published and not no_kv, "skipped": no_kv, "error": problem}
        typer.echo(json.dumps({"revoked": record.to_dict(), "origin": True, "edge": edge}))
    else:
        typer.echo(
            f"Revoked key {record.key_id}{label} of project {record.project} "
            f"at {record.revoked_at}."
        )
        if no_kv:
            typer.echo(PROPAGATION.splitlines()[0] + "\nedge:   not told (--no-kv).")
        elif published:
            typer.echo(PROPAGATION)
    if not published:
        typer.echo(
            f"Warning: revoked in Redis (the origin refuses the key now), but the edge "
            f"was not told: {problem}. Run `prism keys sync` (or the next revoke will) "
            f"to publish the revocation list.",
            err=True,
        )
        raise typer.Exit(1)


@app.command("sync")
def sync(
    redis_url: RedisUrlOption = DEFAULT_REDIS_URL,
    kv_api_url: KVApiOption = DEFAULT_KV_API,
    kv_account_id: KVAccountOption = "",
    kv_namespace_id: KVNamespaceOption = "",
    api_token: KVTokenOption = "",
) -> None:
    """Publish the revoked-key list from Redis to Workers KV again (after a failed revoke).

    Example: prism keys sync
    """
    publisher = kv_publisher(kv_api_url, kv_account_id, kv_namespace_id, api_token)
    with open_store(redis_url) as store:
        published, problem = publish(store, publisher, no_kv=False)
        count = len(store.revoked_ids())
    if not published:
        raise fail(f"{problem}. Redis is unchanged; try again.")
    typer.echo(
        f"Published {count} revoked key id(s) to Workers KV; the edge follows within ~2 min."
    )


@app.command("list")
def list_keys(
    project: Annotated[
        str | None,
        typer.Option("--project", "-p", help="Project id. [default: every project]"),
    ] = None,
    redis_url: RedisUrlOption = DEFAULT_REDIS_URL,
    as_json: JsonOption = False,
) -> None:
    """List managed keys: id, name, prefix, version, created, revoked. Never key material.

    Example: prism keys list --project acme
    """
    with open_store(redis_url) as store:
        projects = [project] if project else store.projects()
        records = [record for p in projects for record in store.list(p)]
    if as_json:
        typer.echo(json.dumps([record.to_dict() for record in records]))
        return
    if not records:
        typer.echo(f"No managed keys for project {project}." if project else "No managed keys.")
        return
    Console().print(_table(records, show_project=project is None))


def _table(records: list[KeyRecord], *, show_project: bool) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    if show_project:
        table.add_column("project", no_wrap=True)
    table.add_column("key id", no_wrap=True)
    table.add_column("name")
    table.add_column("prefix", no_wrap=True)
    table.add_column("v", justify="right")
    table.add_column("created (UTC)", no_wrap=True)
    table.add_column("revoked (UTC)", no_wrap=True)
    for record in records:
        row: list[Any] = [record.project] if show_project else []
        row += [
            record.key_id,
            record.name or "",
            record.prefix,
            str(record.version),
            _when(record.created_at) or "(minted offline)",
            _when(record.revoked_at) or "",
        ]
        table.add_row(*row)
    return table


def _when(stamp: str | None) -> str | None:
    # "2025-01-02T13:04:05Z" -> "2025-01-02 13:04": seconds only cost table width.
    return stamp[:16].replace("T", " ") if stamp else None
