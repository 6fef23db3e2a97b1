"""Every command says what it does, its options and an example; errors are one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from deploy.cli import app
from deploy.local.ports import free_port
from tests.fixtures.stacks import CLI_START

runner = CliRunner()


def leaf_commands() -> list[list[str]]:
    root = typer.main.get_command(app)
    found: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        # Typer vendors its own click: duck-type groups rather than isinstance.
        if hasattr(command, "commands"):
            # A group that runs on its own (`prism bench`) is a command too.
            if path and getattr(command, "invoke_without_command", False):
                found.append(path)
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
        else:
            found.append(path)

    walk(root, [])
    return found


COMMANDS = leaf_commands()


def test_the_cli_has_every_command_the_product_promises() -> None:
    names = {" ".join(path) for path in COMMANDS}
    assert {
        "dev", "smoke", "status", "fingerprint", "bench", "bench faults", "bench budget", "keys mint", "keys verify", "keys create",
        "keys revoke", "keys list", "policy set", "policy show", "policy clear", "audit", "usage", "build edge", "deploy edge", "deploy origin", "origin serve",
    } <= names  # fmt: skip


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_help_has_a_description_options_and_an_example(path: list[str]) -> None:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "Example" in result.output
    assert "--help" in result.output


def test_origin_serve_port_in_use_is_one_line() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "deploy.cli", "origin", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=CLI_START,
            env={
                "PRISM_KEY_SECRET": "x" * 32,
                "PRISM_FORWARD_SECRET": "y" * 32,
                "PATH": "/usr/bin:/bin",
            },
        )
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "in use" in result.stderr


def test_dev_with_unreachable_redis_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "dev", "--state-dir", str(tmp_path),
         "--origin-port", str(free_port()), "--edge-port", str(free_port()), "--kv-port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=CLI_START,
        env={"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 1
    assert "cannot reach Redis" in result.stderr and "Traceback" not in result.stderr


def test_origin_serve_without_secrets_is_one_line() -> None:
    result = runner.invoke(app, ["origin", "serve"], env={"PRISM_KEY_SECRET": ""})
    assert result.exit_code == 2 and "PRISM_KEY_SECRET" in result.output


def test_origin_serve_with_a_kinds_bad_setting_is_one_line_naming_the_provider(
    tmp_path: Path,
) -> None:
    providers = tmp_path / "providers.toml"
    providers.write_text(
        '[providers.az]\nkind = "azure"\nbase_url = "https://x.openai.azure.com"\n'
        'api_key = "k"\nauth = "password"\n\n[models]\n"*" = ["az"]\n'
    )
    env = {"PRISM_KEY_SECRET": "k" * 32, "PRISM_FORWARD_SECRET": "f" * 32,
           "PRISM_PROVIDERS_FILE": str(providers), "REDIS_URL": "redis://127.0.0.1:1/0"}  # fmt: skip
    serve = ["origin", "serve", "--port", "0", "--admin-port", "0", "--workers", "1"]
    result = runner.invoke(app, serve, env=env)
    assert result.exit_code == 2, result.output
    assert "provider 'az'" in result.output and "auth" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
