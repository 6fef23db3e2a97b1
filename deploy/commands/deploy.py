"""``prism deploy``: ship the edge to Cloudflare and the origin to AWS."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from deploy.aws.origin import DeployPlan, apply, plan
from deploy.aws.stack import (
    BASE_SECRETS,
    DEFAULT_INSTANCE_TYPE,
    DEFAULT_NAME,
    DEFAULT_PARAMETER_PREFIX,
    DEFAULT_REGION,
    PROVIDER_KEYS,
    DeployConfigError,
    DeployError,
    DeployResult,
    OriginDeployConfig,
    ReleaseBuilder,
)
from deploy.aws.userdata import FILE_SECRETS
from deploy.cloudflare_edge import (
    DEFAULT_NAMESPACE_TITLE,
    DEFAULT_STAGING_DIR,
    EDGE_SECRETS,
    EdgeConfigError,
    EdgeDeployConfig,
    EdgeDeployError,
    EdgeDeployResult,
    deploy_edge,
)
from deploy.release import ReleaseError, build_release, find_source, find_uv, lock_key

from ._options import JsonOption

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

    from deploy.release import Release

__all__ = ["SECRET_ENV_VARS", "UsageError", "app", "collect_secrets"]

# Everything the origin reads from its environment; only the ones set are stored.
SECRET_ENV_VARS = (
    *BASE_SECRETS,
    *PROVIDER_KEYS,
    "PRISM_KV_ACCOUNT_ID",
    "PRISM_KV_NAMESPACE_ID",
    "CLOUDFLARE_API_TOKEN",
    "PRISM_PROVIDERS_FILE",
    "GROQ_API_KEY",
    "TOGETHER_API_KEY",
    "MISTRAL_API_KEY",
    "DEEPSEEK_API_KEY",
    "OPENROUTER_API_KEY",
)
_DENIED = {
    "AccessDenied",
    "AccessDeniedException",
    "AuthFailure",
    "ExpiredToken",
    "InvalidClientTokenId",
    "UnauthorizedOperation",
    "UnrecognizedClientException",
}

app = typer.Typer(
    name="deploy",
    help="Deploy Prism: the edge to Cloudflare (wrangler), the origin to AWS EC2 (boto3).",
    no_args_is_help=True,
)


class UsageError(Exception):
    """Bad input from the command line or environment (exit code 2)."""


def collect_secrets(environ: Mapping[str, str], extra: Sequence[str] = ()) -> dict[str, str]:
    """The origin's secrets from ``environ``; file-valued ones are read from disk."""
    missing = [name for name in BASE_SECRETS if not environ.get(name)]
    if missing:
        raise UsageError(f"missing required environment variable(s): {', '.join(missing)}")
    unset = [name for name in extra if not environ.get(name)]
    if unset:
        raise UsageError(f"--secret-env variable(s) not set: {', '.join(unset)}")
    secrets = {n: environ[n] for n in dict.fromkeys([*SECRET_ENV_VARS, *extra]) if environ.get(n)}
    for name in FILE_SECRETS:
        if name in secrets:
            try:
                secrets[name] = Path(secrets[name]).read_text(encoding="utf-8")
            except OSError as error:
                raise UsageError(
                    f"cannot read {name} ({secrets[name]}): {error.strerror}"
                ) from None
    return secrets


@app.command("origin")
def origin(
    region: Annotated[
        str, typer.Option(help="AWS region; each region is an independent origin stack.")
    ] = DEFAULT_REGION,
    name: Annotated[
        str, typer.Option(help="Stack name, tagged prism:stack on every resource.")
    ] = DEFAULT_NAME,
    instance_type: Annotated[
        str, typer.Option(help="EC2 instance type (Graviton types get an arm64 AMI).")
    ] = DEFAULT_INSTANCE_TYPE,
    domain: Annotated[
        str | None,
        typer.Option(
            help="Domain served with a public TLS certificate; point its A record at the "
            "printed IP. Without it Caddy serves the IP with a self-signed certificate."
        ),
    ] = None,
    ami: Annotated[
        str | None,
        typer.Option(help="An Ubuntu 24.04 LTS AMI id; default: Canonical's current one."),
    ] = None,
    source: Annotated[
        Path | None,
        typer.Option(help="The checkout to ship; default: the one holding the working directory."),
    ] = None,
    parameter_prefix: Annotated[
        str, typer.Option(help="SSM path prefix; secrets go under <prefix><name>/.")
    ] = DEFAULT_PARAMETER_PREFIX,
    secret_env: Annotated[
        list[str] | None,
        typer.Option(help="Also store this environment variable (repeatable)."),
    ] = None,
    remove_secret: Annotated[
        list[str] | None,
        typer.Option(help="Delete this stored secret (repeatable); others are kept."),
    ] = None,
    instances: Annotated[
        int,
        typer.Option(
            help="Instances in the region: 1 is one instance with an Elastic IP; more is an "
            "Auto Scaling group behind a Network Load Balancer (point the domain at its name).",
        ),
    ] = 1,
    min_instances: Annotated[
        int | None,
        typer.Option("--min", help="The group's minimum size (default: --instances)."),
    ] = None,
    max_instances: Annotated[
        int | None,
        typer.Option("--max", help="The group's maximum size (default: --instances)."),
    ] = None,
    rollback: Annotated[
        bool, typer.Option("--rollback", help="Return to the release that served before.")
    ] = False,
    keep_failed: Annotated[
        bool,
        typer.Option("--keep-failed", help="Keep a new instance that fails its health check."),
    ] = False,
    pure: Annotated[
        bool,
        typer.Option(
            "--pure",
            help="Ship the pure-Python wheel even where the compiled one can be built.",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the plan; no AWS call, no build, no network."),
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Deploy this checkout to EC2 behind Caddy (HTTPS on 443 only), or update it.

    Secrets are read from the environment (REDIS_URL, PRISM_KEY_SECRET,
    PRISM_FORWARD_SECRET and a provider key are required) and stored as SSM
    SecureString parameters, never in user-data; a secret not set is kept.
    A new release runs on a new instance and takes the Elastic IP only once it
    is healthy; with --instances 2 or more, an instance refresh replaces the
    group's instances keeping capacity, and rolls back if they are not healthy.

    Example:

    REDIS_URL=rediss://... PRISM_KEY_SECRET=... PRISM_FORWARD_SECRET=... OPENAI_API_KEY=...
    prism deploy origin --domain origin.example.com
    """
    secrets: dict[str, str] = {}
    try:
        secrets = collect_secrets(os.environ, secret_env or ())
        config = OriginDeployConfig(
            secrets=secrets,
            region=region,
            name=name,
            instance_type=instance_type,
            domain=domain,
            ami=ami,
            parameter_prefix=parameter_prefix,
            remove_secrets=tuple(remove_secret or ()),
            instances=instances,
            min_instances=min_instances,
            max_instances=max_instances,
        )
        checkout = None if rollback else find_source(source)
    except (UsageError, DeployConfigError, ReleaseError) as error:
        _fail(str(error), code=2, secrets=secrets)
    if dry_run:
        shown = plan(config, source=str(checkout or "-"), rollback=rollback, compiled=not pure)
        _print_plan(shown, json_output)
        return
    builder: ReleaseBuilder | None = None
    key = ""
    try:
        uv = None if rollback else find_uv()
    except ReleaseError as error:
        _fail(str(error), code=2, secrets=secrets)
    # boto3 is slow to import: only the command that uses it pays.
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    with tempfile.TemporaryDirectory(prefix="prism-release-") as workdir:
        try:
            with _progress(f"Deploying origin {config.name} to {config.region}") as progress:
                if checkout is not None:
                    source_dir, target = checkout, config.target
                    key = lock_key(source_dir, target)

                    def builder(lock: str | None) -> Release:
                        out = Path(workdir)
                        return build_release(
                            source_dir,
                            target,
                            out,
                            lock=lock,
                            uv=uv,
                            compiled=not pure,
                            progress=progress,
                        )

                result = apply(
                    config,
                    boto3.Session(),
                    progress,
                    release=builder,
                    lock_key=key,
                    rollback=rollback,
                    keep_failed=keep_failed,
                )
        except DeployConfigError as error:  # an option apply refuses (--keep-failed, …)
            _fail(str(error), code=2, secrets=secrets)
        except (DeployError, ReleaseError) as error:
            _fail(str(error), secrets=secrets)
        except NoCredentialsError:
            _fail(
                "no AWS credentials found (set AWS_PROFILE or AWS_ACCESS_KEY_ID)", secrets=secrets
            )
        except ClientError as error:
            _fail(_describe_client_error(error), secrets=secrets)
        except BotoCoreError as error:
            _fail(f"AWS: {error}", secrets=secrets)
    _print_result(result, json_output, domain=config.domain)


@app.command("edge")
def edge(
    account_id: Annotated[
        str | None,
        typer.Option(envvar="CLOUDFLARE_ACCOUNT_ID", help="Cloudflare account id."),
    ] = None,
    namespace: Annotated[
        str, typer.Option(help="Title of the Workers KV namespace; created if missing.")
    ] = DEFAULT_NAMESPACE_TITLE,
    origin_url: Annotated[
        str | None,
        typer.Option(
            envvar="PRISM_ORIGIN_URL",
            help="The origin the edge forwards misses to (https; http only for localhost).",
        ),
    ] = None,
    origin: Annotated[
        list[str] | None,
        typer.Option(
            help="REGION=URL of one origin of several (repeatable; e.g. "
            "us-west-1=https://a.example): the edge asks the nearest first and fails over "
            "(the PRISM_ORIGINS binding). The first is also ORIGIN_URL unless --origin-url.",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Worker name; default: `name` in wrangler.toml.")
    ] = None,
    route: Annotated[
        list[str] | None,
        typer.Option(
            help="Route PATTERN, or PATTERN@ZONE_NAME (repeatable); default: workers.dev only."
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Staging folder for the Worker project; replaced on each run.")
    ] = DEFAULT_STAGING_DIR,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Stage and bundle with `wrangler deploy --dry-run`, offline: no API call, "
            "no token; create, upload and set nothing.",
        ),
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Deploy the edge Worker to Cloudflare: KV namespace, bundle, secrets, wrangler deploy.

    CLOUDFLARE_API_TOKEN (not needed by --dry-run), PRISM_KEY_SECRET and
    PRISM_FORWARD_SECRET are read from the environment; the secrets reach wrangler
    on stdin only. pywrangler (the newest wrangler) needs Node.js 22.12+. Set
    PRISM_CLOUDFLARE_API_URL to use another API base URL and PRISM_WRANGLER to
    choose the wrangler command (default: pywrangler if installed, else the
    repo's pinned node_modules/.bin/wrangler).

    Example:

    CLOUDFLARE_API_TOKEN=... PRISM_KEY_SECRET=... PRISM_FORWARD_SECRET=...
    prism deploy edge --account-id 0123456789abcdef0123456789abcdef
    --origin-url https://origin.example.com --route "gw.example.com/*@example.com"

    Two regions: --origin us-west-1=https://us.example.com
    --origin ap-south-1=https://ap.example.com
    """
    # Masked in any error line, even before the config exists (an API may echo one).
    masked = {n: os.environ.get(n, "") for n in ("CLOUDFLARE_API_TOKEN", *EDGE_SECRETS)}
    origins = ",".join(o.strip() for o in origin or ())
    if origins and not origin_url:
        origin_url = origins.split(",")[0].partition("=")[2]  # validated with the rest
    try:
        config = EdgeDeployConfig.from_env(
            os.environ,
            account_id=account_id,
            origin_url=origin_url,
            namespace_title=namespace,
            name=name,
            routes=route or (),
            dry_run=dry_run,
        )
        if origins:
            config = replace(config, origins=origins)
    except EdgeConfigError as error:
        _fail(str(error), code=2, secrets=masked)
    verb = "Planning" if dry_run else "Deploying"
    try:
        with _progress(f"{verb} edge Worker {config.name}") as progress:
            result = deploy_edge(config, out, dry_run=dry_run, progress=progress)
    except EdgeConfigError as error:
        _fail(str(error), code=2, secrets=masked)
    except EdgeDeployError as error:
        _fail(str(error), secrets=masked)
    _print_edge_result(result, json_output)


@contextmanager
def _progress(title: str) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr showing the current step, with a log line per step."""
    console = Console(stderr=True)
    with console.status(escape(title)) as status:

        def step(message: str) -> None:
            status.update(escape(message))
            console.print(f"[dim]•[/dim] {escape(message)}")

        yield step


def _describe_client_error(error: ClientError) -> str:
    info = error.response.get("Error", {})
    code, message = info.get("Code", "Unknown"), info.get("Message", "")
    verb = "denied" if code in _DENIED else "failed"
    return f"AWS {error.operation_name} {verb}: {code}: {message}"


def _fail(message: str, *, code: int = 1, secrets: Mapping[str, str]) -> NoReturn:
    """One line on stderr and exit; secret values are masked even if AWS echoed one."""
    for value in secrets.values():
        if len(value) >= 4:
            message = message.replace(value, "***")
    line = " ".join(message.split())
    typer.echo(f"error: {line[:400]}", err=True)
    raise typer.Exit(code=code)


def _print_plan(deploy_plan: DeployPlan, json_output: bool) -> None:
    if json_output:
        typer.echo(json.dumps({"dry_run": True, **deploy_plan.to_dict()}, indent=2))
        return
    typer.echo(f"Plan for origin {deploy_plan.name} in {deploy_plan.region} (dry run, no changes)")
    typer.echo(f"  site:  {deploy_plan.site}")
    typer.echo(f"  tls:   {deploy_plan.tls}")
    typer.echo(f"  image: {deploy_plan.image}, Python {deploy_plan.python}")
    if deploy_plan.wheel:
        typer.echo(f"  wheel: {deploy_plan.wheel}")
    if deploy_plan.instances > 1:
        typer.echo(f"  instances: {deploy_plan.instances}")
    for step in deploy_plan.steps:
        typer.echo(f"  {step.resource:<15} {step.name}: {step.action}")


def _print_result(result: DeployResult, json_output: bool, *, domain: str | None) -> None:
    if json_output:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    if result.load_balancer:
        _print_fleet_result(result, domain=domain)
        return
    rows: list[tuple[str, Any]] = [
        ("instance", result.instance_id),
        (
            "release",
            result.release
            + (f" (was {result.previous_release})" if result.previous_release else "")
            + (" rolled back" if result.rolled_back else ""),
        ),
        ("address", f"{result.public_ip} ({result.public_dns or 'no public DNS'})"),
        ("security group", result.security_group_id),
        (
            "secrets",
            f"{len(result.parameter_names)} SSM parameters, "
            f"{len(result.parameters_changed)} changed, "
            f"{len(result.parameters_kept)} kept from earlier deploys",
        ),
        ("url", result.url),
    ]
    typer.echo(f"Origin {result.name} {result.action} in {result.region}")
    for label, value in rows:
        typer.echo(f"  {label:<15} {value}")
    if domain:
        typer.echo(
            f"Next: point DNS A {domain} at {result.public_ip}; edge ORIGIN_URL={result.url}"
        )
    else:
        typer.echo(
            "Note: no --domain, so Caddy uses a self-signed certificate; the edge needs one."
        )


def _print_fleet_result(result: DeployResult, *, domain: str | None) -> None:
    rows: list[tuple[str, Any]] = [
        ("instances", f"{result.instances}: {', '.join(result.instance_ids) or 'starting'}"),
        (
            "release",
            result.release
            + (f" (was {result.previous_release})" if result.previous_release else "")
            + (" rolled back" if result.rolled_back else ""),
        ),
        ("launch template", f"version {result.launch_template_version}"),
        ("load balancer", result.load_balancer),
        ("security group", result.security_group_id),
        (
            "secrets",
            f"{len(result.parameter_names)} SSM parameters, "
            f"{len(result.parameters_changed)} changed, "
            f"{len(result.parameters_kept)} kept from earlier deploys",
        ),
        ("url", result.url),
    ]
    if result.instance_refresh_id:
        rows.insert(3, ("instance refresh", result.instance_refresh_id))
    typer.echo(f"Origin {result.name} {result.action} in {result.region}")
    for label, value in rows:
        typer.echo(f"  {label:<16} {value}")
    if domain:
        typer.echo(
            f"Next: point DNS CNAME {domain} at {result.load_balancer}; "
            f"edge ORIGIN_URL={result.url}"
        )
    else:
        typer.echo(
            "Note: no --domain, so each Caddy uses a self-signed certificate; the edge needs one."
        )


def _print_edge_result(result: EdgeDeployResult, json_output: bool) -> None:
    if json_output:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    if result.dry_run:
        typer.echo(f"Plan for edge Worker {result.name} (dry run: nothing created or deployed)")
    else:
        typer.echo(f"Edge Worker {result.name} deployed")
    for step in result.plan:
        typer.echo(f"  {step.step:<15} {step.action}: {step.detail}")
    for url in result.urls:
        typer.echo(f"  {'url':<15} {url}")
    if result.version_id:
        typer.echo(f"  {'version':<15} {result.version_id}")
    if result.dry_run:
        typer.echo(f"Bundle ({len(result.modules)} modules, built in {result.bundle_dir}):")
        for module in result.modules:
            typer.echo(f"  {module}")
