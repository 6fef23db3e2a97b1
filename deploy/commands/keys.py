"""`prism keys`: mint and verify API keys (offline, with the shared core)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from prism import KeyRing, PrismError, parse_key_secrets

__all__ = ["app"]

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
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
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
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
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
