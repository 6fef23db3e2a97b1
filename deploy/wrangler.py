"""Running wrangler (or pywrangler) for the edge deploy: which Node.js it needs, its
environment, its output read back in one safe line, and the secrets on its stdin.

pywrangler: the repo pins ``compatibility_date = "2026-04-20"``, the last date
at which the runtime still provides the ``workers`` SDK. From 2026-04-21 the
SDK must be vendored into ``python_modules/``, which ``pywrangler deploy``
(PyPI ``workers-py``; ``uv tool install workers-py``) does before proxying to
wrangler; the staged ``pyproject.toml`` lists no dependencies, so it vendors
only that SDK. To switch: install pywrangler, then raise the date in the
repo's ``wrangler.toml``. :func:`deploy.cloudflare_config.find_wrangler` prefers
``pywrangler`` whenever it is installed, and a date that needs it is refused without it. It is not a
dependency of this project (it fetches a current wrangler with ``npx``, which
cannot run offline). That newest wrangler needs Node.js 22.12+ (the pinned
3.91 runs on Node 16.17+): :func:`check_node` refuses an older Node with both
versions in one line. Only wrangler 4.86+ uploads a vendored ``python_modules/``;
the pinned 3.91 ignores the folder.

The edge secrets reach wrangler only as JSON on stdin (:func:`set_secrets`), never in
argv (a process list shows argv), a file, a log or our output; its environment drops
them, and everything it prints is masked before it is shown or raised.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from deploy.cloudflare_config import (
    DEFAULT_API_URL,
    EDGE_SECRETS,
    EdgeConfigError,
    EdgeDeployConfig,
    EdgeDeployError,
)

__all__ = [
    "NEWEST_WRANGLER_NODE",
    "check_node",
    "node_requirement",
    "parse_deploy_output",
    "run_wrangler",
    "set_secrets",
    "uses_pywrangler",
]

# What the newest wrangler (pywrangler's, npx's) needs; the pinned 3.91 runs on Node 16.17+.
NEWEST_WRANGLER_NODE = (22, 12, 0)
_WRANGLER_TIMEOUT = 600.0
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _version(text: str) -> tuple[int, ...]:
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(part or 0) for part in found.groups()) if found else ()


def node_requirement(command: Sequence[str]) -> tuple[str, tuple[int, ...]] | None:
    """(which wrangler, the Node.js version it needs), or None when not known.

    pywrangler and ``npx wrangler`` run the newest wrangler (Node.js 22.12+); a wrangler
    installed in ``node_modules`` says what it needs in its ``engines``.
    """
    if uses_pywrangler(command) or any(Path(part).name == "npx" for part in command):
        return "the newest wrangler", NEWEST_WRANGLER_NODE
    for part in command:
        path = Path(part)
        if path.name == "wrangler" and path.parent.name == ".bin":
            package = path.parent.parent / "wrangler" / "package.json"
            try:
                meta = json.loads(package.read_text())
            except (OSError, ValueError):
                return None
            wanted = _version(str(meta.get("engines", {}).get("node", "")))
            return (f"wrangler {meta.get('version', '?')}", wanted) if wanted else None
    return None


def check_node(command: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
    """Refuse, with the versions in one line, a Node.js too old for this wrangler."""
    needed = node_requirement(command)
    if needed is None:
        return
    which, minimum = needed
    want = ".".join(map(str, minimum))
    environ = os.environ if environ is None else environ
    node = shutil.which("node", path=environ.get("PATH"))
    if node is None:
        raise EdgeConfigError(f"{which} needs Node.js >= {want}; node is not on PATH")
    try:
        shown = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        raise EdgeConfigError(f"cannot run {node} --version: {error}") from None
    if _version(shown) < minimum:
        hint = (
            "; install Node.js 22.12+, or use the pinned wrangler 3.91 (npm ci; no PRISM_WRANGLER)"
            if minimum == NEWEST_WRANGLER_NODE
            else ""
        )
        raise EdgeConfigError(f"{which} needs Node.js >= {want}; this is node {shown}{hint}")


def uses_pywrangler(command: Sequence[str]) -> bool:
    return any(Path(part).name == "pywrangler" for part in command)


def _wrangler_env(config: EdgeDeployConfig) -> dict[str, str]:
    env = dict(os.environ)
    # wrangler prefers a global API key from the environment over the token, and it
    # has no use for the edge secrets: they reach it only on stdin.
    for name in ("CLOUDFLARE_API_KEY", "CLOUDFLARE_EMAIL", *EDGE_SECRETS):
        env.pop(name, None)
    # A dry run may have neither: wrangler then bundles without authenticating.
    env.update(
        {
            name: value
            for name, value in (
                ("CLOUDFLARE_API_TOKEN", config.api_token),
                ("CLOUDFLARE_ACCOUNT_ID", config.account_id),
            )
            if value
        }
    )
    env.update(
        WRANGLER_SEND_METRICS="false",
        # Never debug level (request bodies) and never unsanitized logs, whatever
        # the caller's environment says: wrangler writes a log file of every run.
        WRANGLER_LOG="log",
        WRANGLER_LOG_SANITIZE="true",
        CI="true",  # no prompts
        NO_COLOR="1",
        FORCE_COLOR="0",
    )
    if config.api_url != DEFAULT_API_URL:
        # One API for both halves of the deploy: the SDK and wrangler.
        env["CLOUDFLARE_API_BASE_URL"] = config.api_url
    return env


def _error_line(output: str) -> str:
    """The ``[ERROR]`` paragraph of wrangler's output in one line, else its last line."""
    lines = [_ANSI.sub("", line).rstrip() for line in output.splitlines()]
    for index, line in enumerate(lines):
        if "[ERROR]" in line:
            paragraph = [line.split("[ERROR]", 1)[1]]
            for following in lines[index + 1 : index + 12]:
                if not following.strip() and len(paragraph) > 1:
                    break
                paragraph.append(following)
            return " ".join(" ".join(paragraph).split())
    meaningful = [line.strip() for line in lines if line.strip()]
    return meaningful[-1] if meaningful else "no output"


def run_wrangler(
    config: EdgeDeployConfig,
    command: Sequence[str],
    args: Sequence[str],
    *,
    cwd: Path,
    stdin: str | None = None,
) -> str:
    """Run wrangler and return its combined output, masked; raise on failure."""
    what = f"wrangler {' '.join(args[:2])}"
    try:
        completed = subprocess.run(
            [*command, *args],
            cwd=cwd,
            env=_wrangler_env(config),
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            timeout=_WRANGLER_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        raise EdgeDeployError(f"{what}: {command[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise EdgeDeployError(f"{what} timed out after {_WRANGLER_TIMEOUT:.0f}s") from None
    output = config.masked(f"{completed.stdout}\n{completed.stderr}")
    if completed.returncode != 0:
        raise EdgeDeployError(f"{what} failed (exit {completed.returncode}): {_error_line(output)}")
    return output


def set_secrets(config: EdgeDeployConfig, command: Sequence[str], staged: Path) -> None:
    payload = json.dumps(dict(config.secrets))
    output = run_wrangler(
        config, command, ["secret", "bulk", "--name", config.name], cwd=staged, stdin=payload
    )
    # wrangler exits 0 even when it could not read the JSON: trust only its tally.
    uploaded = re.search(r"(\d+) secrets? successfully uploaded", output)
    if uploaded is None or int(uploaded.group(1)) != len(config.secrets):
        raise EdgeDeployError(
            f"wrangler secret bulk did not set the secrets: {_error_line(output)}"
        )


def parse_deploy_output(output: str) -> tuple[tuple[str, ...], str | None]:
    lines = [_ANSI.sub("", line).strip() for line in output.splitlines()]
    urls = tuple(dict.fromkeys(line for line in lines if line.startswith("https://")))
    version = re.search(r"Current Version ID:\s*(\S+)", "\n".join(lines))
    return urls, version.group(1) if version else None
