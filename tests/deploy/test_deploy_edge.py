"""`prism deploy edge` offline: the KV REST stand-in for the API, the pinned wrangler's
dry run for the bundle, and a recording fake wrangler for the steps that need Cloudflare."""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest
import typer
from cloudflare import Cloudflare
from typer.testing import CliRunner

from deploy import cloudflare_edge
from deploy.cloudflare_edge import (
    EdgeConfigError,
    EdgeDeployConfig,
    WorkerRoute,
    ensure_namespace,
    find_namespace,
    find_wrangler,
    make_client,
)
from deploy.commands import deploy
from tests.fixtures.workers import KVApi

REPO = Path(__file__).resolve().parents[2]
WRANGLER = REPO / "node_modules" / ".bin" / "wrangler"
needs_wrangler = pytest.mark.skipif(
    not os.access(WRANGLER, os.X_OK),
    reason="node_modules/.bin/wrangler is missing: run `npm ci` (package.json pins wrangler)",
)
KEY_SECRET = "edge-key-secret-6f1c2b9a5d"
FORWARD_SECRET = "edge-forward-secret-93ad7e"
ORIGIN = "https://origin.example.com"
STAGED = re.compile(r"(src/entry\.py|src/(edge|prism)/[a-z_]+\.py|wrangler\.toml|pyproject\.toml)")

# Records each call (argv, cwd, stdin, the environment wrangler cares about) as a JSON line.
FAKE_WRANGLER = r"""
import json, os, sys
stdin = sys.stdin.read()
names = ("CLOUDFLARE_API_TOKEN", "CLOUDFLARE_ACCOUNT_ID", "CLOUDFLARE_API_BASE_URL",
         "CLOUDFLARE_API_KEY", "CLOUDFLARE_EMAIL", "PRISM_KEY_SECRET", "PRISM_FORWARD_SECRET",
         "WRANGLER_SEND_METRICS", "WRANGLER_LOG")
record = {"argv": sys.argv[1:], "cwd": os.getcwd(), "stdin": stdin,
          "env": {n: os.environ.get(n) for n in names}}
with open(os.environ["FAKE_WRANGLER_LOG"], "a") as log:
    log.write(json.dumps(record) + "\n")
mode = os.environ.get("FAKE_WRANGLER_MODE", "ok")
if mode == "fail":
    # Echo everything sensitive it was given: the caller must mask it.
    print("\x1b[31m✘ [ERROR]\x1b[0m A request failed: token", os.environ["CLOUDFLARE_API_TOKEN"])
    print("  body:", stdin)
    sys.exit(1)
if sys.argv[1:3] == ["secret", "bulk"]:
    uploaded = 0 if mode == "silent" else len(json.loads(stdin))
    print(f"✨ {uploaded} secrets successfully uploaded")
elif sys.argv[1:2] == ["deploy"]:
    print("Uploaded prism-edge (1.02 sec)")
    print("Deployed prism-edge triggers (0.31 sec)")
    print("  https://prism-edge.example.workers.dev")
    print("Current Version ID: 0f6b3c1e-1111-4222-8333-944455556666")
"""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def namespace_titles(kv_api: KVApi) -> list[str]:
    response = kv_api.http.get(kv_api.namespaces_url(), params={"per_page": 1000})
    response.raise_for_status()
    return [ns["title"] for ns in response.json()["result"]]


def edge_env(kv_api: KVApi, **overrides: str | None) -> dict[str, str | None]:
    env: dict[str, str | None] = {
        "CLOUDFLARE_API_TOKEN": kv_api.api_token,
        "CLOUDFLARE_ACCOUNT_ID": kv_api.account_id,
        "PRISM_CLOUDFLARE_API_URL": kv_api.url,
        "PRISM_ORIGIN_URL": ORIGIN,
        "PRISM_KEY_SECRET": KEY_SECRET,
        "PRISM_FORWARD_SECRET": FORWARD_SECRET,
        # Pinned explicitly: an installed pywrangler would otherwise win (and go online).
        "PRISM_WRANGLER": str(WRANGLER),
        "CLOUDFLARE_API_KEY": None,
        "CLOUDFLARE_EMAIL": None,
    }
    return {**env, **overrides}


def environ_of(kv_api: KVApi, **overrides: str | None) -> dict[str, str]:
    """:func:`edge_env` as an environment mapping (unset names left out)."""
    return {k: v for k, v in edge_env(kv_api, **overrides).items() if v is not None}


def assert_no_secrets(text: str, kv_api: KVApi) -> None:
    for value in (KEY_SECRET, FORWARD_SECRET, kv_api.api_token):
        assert value not in text


def error_lines(stderr: str) -> list[str]:
    """The command's error output: the progress lines are on stderr too."""
    return [line for line in stderr.splitlines() if line.startswith("error")]


@pytest.fixture
def cli() -> typer.Typer:
    root = typer.Typer()
    root.add_typer(deploy.app)
    return root


@pytest.fixture
def fake_wrangler(tmp_path: Path) -> tuple[str, Path]:
    """(PRISM_WRANGLER value, the log of its calls)."""
    script = tmp_path / "fake_wrangler.py"
    script.write_text(FAKE_WRANGLER)
    return f"{sys.executable} {script}", tmp_path / "wrangler-calls.jsonl"


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


# --- the KV namespace, through the cloudflare SDK ----------------------------------


def test_ensure_namespace_creates_it_once_then_finds_it(kv_api_reset: KVApi) -> None:
    kv_api = kv_api_reset
    client = Cloudflare(api_token=kv_api.api_token, base_url=kv_api.url, max_retries=0)
    title = unique("prism-cache-test")

    first = ensure_namespace(client, kv_api.account_id, title)
    second = ensure_namespace(client, kv_api.account_id, title)

    assert first[1] is True and second == (first[0], False)
    assert namespace_titles(kv_api).count(title) == 1
    assert find_namespace(client, kv_api.account_id, title) == first[0]
    assert kv_api.stats().get("namespace_create_calls") == 1


def test_ensure_namespace_adopts_one_created_concurrently(
    kv_api: KVApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Cloudflare(api_token=kv_api.api_token, base_url=kv_api.url, max_retries=0)
    title = unique("prism-cache-race")
    created = client.kv.namespaces.create(account_id=kv_api.account_id, title=title)
    assert created is not None
    real_find = cloudflare_edge.find_namespace
    lookups: list[str] = []

    def find_after_the_other_deploy(c: Cloudflare, account: str, t: str) -> str | None:
        # The first lookup ran before the other deploy created the namespace.
        lookups.append(t)
        return None if len(lookups) == 1 else real_find(c, account, t)

    monkeypatch.setattr(cloudflare_edge, "find_namespace", find_after_the_other_deploy)

    assert ensure_namespace(client, kv_api.account_id, title) == (created.id, False)
    assert len(lookups) == 2 and namespace_titles(kv_api).count(title) == 1


def test_client_uses_the_token_even_with_global_key_variables_set(
    kv_api: KVApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK would send these instead of the token; the stand-in accepts only the token.
    monkeypatch.setenv("CLOUDFLARE_EMAIL", "someone@example.com")
    monkeypatch.setenv("CLOUDFLARE_API_KEY", "global-api-key-0000")
    config = EdgeDeployConfig.from_env(environ_of(kv_api))

    namespace_id = find_namespace(make_client(config), kv_api.account_id, "prism-cache")

    assert namespace_id == kv_api.namespace_id


# --- configuration -----------------------------------------------------------------


def test_routes_parse_with_an_optional_zone() -> None:
    assert WorkerRoute.parse("gw.example.com/*") == WorkerRoute("gw.example.com/*")
    assert WorkerRoute.parse("gw.example.com/*@example.com") == WorkerRoute(
        "gw.example.com/*", "example.com"
    )
    assert WorkerRoute.parse("example.com/@team/*") == WorkerRoute("example.com/@team/*")
    assert WorkerRoute("gw.example.com/*").to_wrangler() == {
        "pattern": "gw.example.com/*",
        "custom_domain": False,
    }
    with pytest.raises(EdgeConfigError):
        WorkerRoute.parse("has space/*")


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://origin.example.com", True),
        ("http://127.0.0.1:8080", True),
        ("http://localhost:8080/", True),
        ("http://origin.example.com", False),
        ("https://user:pw@origin.example.com", False),
        ("origin.example.com", False),
    ],
)
def test_origin_url_must_be_https_except_on_loopback(kv_api: KVApi, url: str, ok: bool) -> None:
    environ = environ_of(kv_api, PRISM_ORIGIN_URL=url)
    if ok:
        assert EdgeDeployConfig.from_env(environ).origin_url == url.rstrip("/")
    else:
        with pytest.raises(EdgeConfigError, match="origin URL"):
            EdgeDeployConfig.from_env(environ)


def test_config_repr_hides_the_token_and_secrets(kv_api: KVApi) -> None:
    config = EdgeDeployConfig.from_env(environ_of(kv_api))
    assert_no_secrets(repr(config), kv_api)


def test_find_wrangler_prefers_the_override_then_pywrangler_then_the_pinned_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no venv pywrangler
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pywrangler = bin_dir / "pywrangler"
    pywrangler.write_text("#!/bin/sh\n")
    pywrangler.chmod(0o755)

    assert find_wrangler({"PRISM_WRANGLER": "npx wrangler@3.91.0"}) == ("npx", "wrangler@3.91.0")
    assert find_wrangler({"PATH": str(bin_dir)}) == (str(pywrangler),)
    pinned = find_wrangler({"PATH": str(tmp_path)}, search_from=[REPO / "tests"])
    assert pinned == (str(WRANGLER),) or not WRANGLER.exists()
    with pytest.raises(EdgeConfigError, match="npm ci"):
        find_wrangler({"PATH": str(tmp_path)}, search_from=[tmp_path])


# --- the command: dry run with the pinned wrangler ---------------------------------


@needs_wrangler
def test_dry_run_stages_only_the_worker_and_bundles_it(
    kv_api: KVApi, cli: typer.Typer, tmp_path: Path
) -> None:
    out = tmp_path / "stage"
    args = ["deploy", "edge", "--dry-run", "--out", str(out)]
    args += ["--route", "gw.example.com/*@example.com"]
    # Offline: no token, no account, and an API address where nothing listens.
    env = edge_env(
        kv_api,
        CLOUDFLARE_API_TOKEN=None,
        CLOUDFLARE_ACCOUNT_ID=None,
        PRISM_CLOUDFLARE_API_URL="http://127.0.0.1:9",
    )

    result = CliRunner().invoke(cli, args, env=env)

    assert result.exit_code == 0, result.output
    staged = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert staged and all(STAGED.fullmatch(path) for path in staged), staged
    assert {"src/entry.py", "src/edge/handler.py", "src/prism/keys.py"} <= set(staged)
    config = tomllib.loads((out / "wrangler.toml").read_text())
    assert config["kv_namespaces"][0]["id"] == "0" * 32  # the placeholder: no lookup
    assert config["vars"]["ORIGIN_URL"] == ORIGIN
    assert config["routes"] == [{"pattern": "gw.example.com/*", "zone_name": "example.com"}]
    assert not set(config["vars"]) & {"PRISM_KEY_SECRET", "PRISM_FORWARD_SECRET"}
    bundle = tmp_path / "stage-bundle"
    for module in ("entry.py", "edge/workers.py", "prism/fingerprint.py"):
        assert (bundle / module).is_file()
        assert module in result.stdout
    assert "would set: PRISM_KEY_SECRET, PRISM_FORWARD_SECRET" in result.stdout
    assert_no_secrets(result.output + (out / "wrangler.toml").read_text(), kv_api)


@needs_wrangler
def test_dry_run_json_lists_the_plan_and_creates_nothing(
    kv_api: KVApi, cli: typer.Typer, tmp_path: Path
) -> None:
    title = unique("prism-cache-plan")
    args = ["deploy", "edge", "--dry-run", "--json", "--namespace", title]
    args += ["--out", str(tmp_path / "stage"), "--name", "prism-edge-staging"]

    result = CliRunner().invoke(cli, args, env=edge_env(kv_api))

    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    plan = {step["step"]: step for step in shown["plan"]}
    assert shown["dry_run"] is True and shown["name"] == "prism-edge-staging"
    assert plan["kv namespace"]["action"] == "would find or create"
    assert shown["namespace_id"] is None
    assert plan["secrets"] == {
        "step": "secrets",
        "action": "would set",
        "detail": "PRISM_KEY_SECRET, PRISM_FORWARD_SECRET",
    }
    assert shown["secrets"] == ["PRISM_KEY_SECRET", "PRISM_FORWARD_SECRET"]
    assert shown["modules"][0] == "entry.py" and "prism/keys.py" in shown["modules"]
    assert title not in namespace_titles(kv_api)
    assert_no_secrets(result.output, kv_api)


# --- the command: a deploy, with a recording fake wrangler -------------------------


def test_deploy_creates_the_namespace_sets_secrets_on_stdin_then_deploys(
    kv_api: KVApi, cli: typer.Typer, tmp_path: Path, fake_wrangler: tuple[str, Path]
) -> None:
    command, log = fake_wrangler
    title = unique("prism-cache-deploy")
    out = tmp_path / "stage"
    args = ["deploy", "edge", "--namespace", title, "--out", str(out)]
    env = edge_env(kv_api, PRISM_WRANGLER=command, FAKE_WRANGLER_LOG=str(log))

    first = CliRunner().invoke(cli, args, env=env)
    second = CliRunner().invoke(cli, [*args, "--json"], env=env)

    assert first.exit_code == 0, first.output
    assert "kv namespace    created" in first.stdout
    assert "https://prism-edge.example.workers.dev" in first.stdout
    assert second.exit_code == 0, second.output
    shown = json.loads(second.stdout)
    assert shown["plan"][0]["action"] == "exists" and namespace_titles(kv_api).count(title) == 1
    assert shown["version_id"] == "0f6b3c1e-1111-4222-8333-944455556666"
    config = tomllib.loads((out / "wrangler.toml").read_text())
    assert config["kv_namespaces"][0]["id"] == shown["namespace_id"]

    recorded = calls(log)
    assert [c["argv"][:2] for c in recorded] == [["secret", "bulk"], ["deploy"]] * 2
    secret_call, deploy_call = recorded[0], recorded[1]
    assert json.loads(secret_call["stdin"]) == {
        "PRISM_KEY_SECRET": KEY_SECRET,
        "PRISM_FORWARD_SECRET": FORWARD_SECRET,
    }
    for call in recorded:
        assert Path(call["cwd"]) == out.resolve()
        assert_no_secrets(" ".join(call["argv"]), kv_api)
        assert call["env"]["CLOUDFLARE_API_TOKEN"] == kv_api.api_token
        assert call["env"]["CLOUDFLARE_ACCOUNT_ID"] == kv_api.account_id
        assert call["env"]["CLOUDFLARE_API_BASE_URL"] == kv_api.url
        assert call["env"]["PRISM_KEY_SECRET"] is None
        assert call["env"]["WRANGLER_SEND_METRICS"] == "false"
    assert deploy_call["stdin"] == ""
    assert_no_secrets(first.output + second.output, kv_api)


@pytest.mark.parametrize("mode", ["fail", "silent"])
def test_a_wrangler_failure_is_one_masked_line_and_exit_1(
    kv_api: KVApi, cli: typer.Typer, tmp_path: Path, fake_wrangler: tuple[str, Path], mode: str
) -> None:
    command, log = fake_wrangler
    env = edge_env(
        kv_api, PRISM_WRANGLER=command, FAKE_WRANGLER_LOG=str(log), FAKE_WRANGLER_MODE=mode
    )
    args = ["deploy", "edge", "--out", str(tmp_path / "stage")]

    result = CliRunner().invoke(cli, args, env=env)

    assert result.exit_code == 1
    [line] = error_lines(result.stderr)
    assert line.startswith("error: wrangler secret bulk")
    assert "Traceback" not in result.output
    assert_no_secrets(result.output, kv_api)
    assert [c["argv"][0] for c in calls(log)] == ["secret"]  # never deployed without secrets


# --- the command: bad input and API errors -----------------------------------------


@pytest.mark.parametrize(
    ("unset", "named"),
    [
        ("CLOUDFLARE_API_TOKEN", "CLOUDFLARE_API_TOKEN"),
        ("CLOUDFLARE_ACCOUNT_ID", "--account-id (or CLOUDFLARE_ACCOUNT_ID)"),
        ("PRISM_ORIGIN_URL", "--origin-url (or PRISM_ORIGIN_URL)"),
        ("PRISM_FORWARD_SECRET", "PRISM_FORWARD_SECRET"),
    ],
)
def test_missing_input_exits_2_with_one_line(
    kv_api: KVApi, cli: typer.Typer, tmp_path: Path, unset: str, named: str
) -> None:
    args = ["deploy", "edge", "--out", str(tmp_path / "stage")]
    result = CliRunner().invoke(cli, args, env=edge_env(kv_api, **{unset: None}))

    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"error: missing {named}"]
    assert result.stdout == ""


def test_an_api_error_is_one_line_and_exit_1(
    kv_api_reset: KVApi, cli: typer.Typer, tmp_path: Path
) -> None:
    kv_api_reset.fail_next(403, endpoints=["namespaces_list"])
    args = ["deploy", "edge", "--out", str(tmp_path / "stage")]

    result = CliRunner().invoke(cli, args, env=edge_env(kv_api_reset))

    assert result.exit_code == 1
    [line] = error_lines(result.stderr)
    assert line.startswith("error: Cloudflare API 403 while finding or creating KV namespace")
    assert "CLOUDFLARE_API_TOKEN may edit" in line
    assert "Traceback" not in result.output
    assert not (tmp_path / "stage").exists()


def test_a_wrong_token_is_one_line_without_the_token(
    kv_api: KVApi, cli: typer.Typer, tmp_path: Path
) -> None:
    token = "wrong-token-4a7c9e1b"
    args = ["deploy", "edge", "--out", str(tmp_path / "stage")]

    result = CliRunner().invoke(cli, args, env=edge_env(kv_api, CLOUDFLARE_API_TOKEN=token))

    assert result.exit_code == 1
    [line] = error_lines(result.stderr)
    assert "Authentication error" in line and token not in result.output


def test_refuses_to_replace_a_folder_it_did_not_make(
    kv_api: KVApi, cli: typer.Typer, tmp_path: Path
) -> None:
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    args = ["deploy", "edge", "--dry-run", "--out", str(tmp_path)]

    result = CliRunner().invoke(cli, args, env=edge_env(kv_api))

    assert result.exit_code == 2
    [line] = error_lines(result.stderr)
    assert "was not made by prism" in line
    assert precious.read_text() == "keep me"


def fake_node(tmp_path: Path, version: str) -> str:
    """A PATH whose `node` reports ``version`` (and nothing else)."""
    bin_dir = tmp_path / f"node-{version}"
    bin_dir.mkdir()
    node = bin_dir / "node"
    node.write_text(f"#!/bin/sh\necho {version}\n")
    node.chmod(0o755)
    return str(bin_dir)


@pytest.mark.parametrize("wrangler", ["npx wrangler@latest", "pywrangler"])
def test_the_newest_wrangler_on_an_old_node_is_one_line_not_a_stack_trace(
    kv_api: KVApi, cli: typer.Typer, tmp_path: Path, wrangler: str
) -> None:
    args = ["deploy", "edge", "--dry-run", "--out", str(tmp_path / "stage")]
    env = edge_env(kv_api, PRISM_WRANGLER=wrangler, PATH=fake_node(tmp_path, "v20.19.1"))

    result = CliRunner().invoke(cli, args, env=env)

    assert result.exit_code == 2
    assert error_lines(result.stderr) == [
        "error: the newest wrangler needs Node.js >= 22.12.0; this is node v20.19.1; install "
        "Node.js 22.12+, or use the pinned wrangler 3.91 (npm ci; no PRISM_WRANGLER)"
    ]
    assert "Traceback" not in result.output
    assert not (tmp_path / "stage").exists()


def test_node_requirements_come_from_the_wrangler_in_use(tmp_path: Path) -> None:
    assert cloudflare_edge.node_requirement(("npx", "wrangler@latest")) == (
        "the newest wrangler",
        (22, 12, 0),
    )
    if WRANGLER.exists():  # the pinned one says what it needs in its engines
        assert cloudflare_edge.node_requirement((str(WRANGLER),)) == (
            "wrangler 3.91.0",
            (16, 17, 0),
        )
    assert cloudflare_edge.node_requirement((sys.executable, "fake.py")) is None
    cloudflare_edge.check_node(("npx", "wrangler"), {"PATH": fake_node(tmp_path, "v22.12.0")})
    with pytest.raises(EdgeConfigError, match="node is not on PATH"):
        cloudflare_edge.check_node(("npx", "wrangler"), {"PATH": str(tmp_path / "none")})


def test_help_documents_the_options_with_an_example(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["deploy", "edge", "--help"], env={"COLUMNS": "200"})

    assert result.exit_code == 0
    for option in ("--account-id", "--namespace", "--origin-url", "--name", "--route"):
        assert option in result.stdout
    for option in ("--out", "--dry-run", "--json", "Example", "prism deploy edge"):
        assert option in result.stdout
