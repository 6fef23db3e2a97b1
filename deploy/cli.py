"""The `prism` command: one module per command group, composed here."""

from __future__ import annotations

import typer

from .commands import bench, build, deploy, keys, logs, origin, policy
from .commands.audit import audit_command
from .commands.dev import dev_command
from .commands.fingerprint import fingerprint_command
from .commands.smoke import smoke_command
from .commands.status import status_command
from .commands.top import top_command
from .commands.usage import usage_command

__all__ = ["app", "main"]

app = typer.Typer(
    name="prism",
    help="Prism: an OpenAI-compatible LLM gateway with a cache at every Cloudflare PoP.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(keys.app)
app.add_typer(policy.app)
app.add_typer(origin.app)
app.add_typer(deploy.app)
app.add_typer(build.app)
app.command("fingerprint")(fingerprint_command)
app.command("dev")(dev_command)
app.add_typer(bench.app)
app.command("smoke")(smoke_command)
app.command("status")(status_command)
app.command("audit")(audit_command)
app.command("usage")(usage_command)
app.command("top")(top_command)
app.add_typer(logs.app, name="logs")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
