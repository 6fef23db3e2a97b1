"""docs/deploying.md's commands run as written: the block is read from the page (so the two
cannot drift) and run by bash, offline, without credentials, from an empty folder."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WRANGLER = REPO / "node_modules" / ".bin" / "wrangler"


def deploying_block() -> str:
    page = (REPO / "docs" / "deploying.md").read_text(encoding="utf-8")
    found = re.search(r"```sh\n(.*?)```", page, re.S)
    assert found is not None, "docs/deploying.md has no ```sh block"
    return found.group(1)


def test_every_deploy_command_in_the_page_is_a_dry_run() -> None:
    commands = [line for line in deploying_block().splitlines() if "prism deploy" in line]

    assert len(commands) >= 2
    assert all(line.rstrip().endswith("--dry-run") for line in commands), commands


@pytest.mark.skipif(not os.access(WRANGLER, os.X_OK), reason="run `npm ci` (pinned wrangler)")
@pytest.mark.skipif(shutil.which("openssl") is None, reason="the deploy block uses openssl")
def test_the_pages_deploy_block_runs_offline_without_credentials(tmp_path: Path) -> None:
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "SYSTEMROOT")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(tmp_path),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        # Anything that tried the network would fail on this proxy.
        HTTPS_PROXY="http://127.0.0.1:9",
        HTTP_PROXY="http://127.0.0.1:9",
        PRISM_CLOUDFLARE_API_URL="http://127.0.0.1:9",
        COLUMNS="200",
    )
    script = (
        "set -euo pipefail\n"
        + deploying_block()
        + 'printf "SECRETS %s %s\\n" "$PRISM_KEY_SECRET" "$PRISM_FORWARD_SECRET" >&2\n'
    )

    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert out.count("Plan for origin main in ap-south-1 (dry run, no changes)") == 2
    assert "Plan for origin main in eu-west-1 (dry run, no changes)" in out
    assert "the release that served before the current one" in out  # the --rollback plan
    assert "Plan for edge Worker prism-edge (dry run: nothing created or deployed)" in out
    assert "/prism/origin/main/PRISM_KEY_SECRET = ***" in out
    assert (tmp_path / "build" / "edge" / "wrangler.toml").is_file()
    secrets = done.stderr.rsplit("SECRETS ", 1)[1].split()
    assert len(secrets) == 2 and all(len(value) == 64 for value in secrets)
    for value in (*secrets, "PASSWORD@redis", "sk-example"):
        assert value not in out and value not in done.stderr.rsplit("SECRETS ", 1)[0]
