"""`prism status` against real parts: the edge stack (the edge in the local Workers runtime,
the origin, Redis, the provider stand-in), an origin serving TLS with a self-signed
certificate, and a `prism dev` state folder with $REDIS_URL naming another Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from typer.testing import CliRunner

from deploy.cli import app
from deploy.key_store import KeyStore
from deploy.local.asgi_thread import ThreadedServer
from deploy.local.provider import ProviderServer, closed_port
from origin import Settings, create_app
from origin.http.server import server_options
from prism import KeyRing, parse_key_secrets
from tests.fixtures.edge import EdgeStack
from tests.fixtures.origin import KEY_SECRET, origin_env

runner = CliRunner()
# Nothing from the machine running the tests may leak into what status checks.
CLEAN_ENV = {
    name: None for name in ("REDIS_URL", "PRISM_API_KEY", "PRISM_ORIGIN_URL", "PRISM_EDGE_URL")
}


def status(*args: str, env: Mapping[str, str | None] | None = None) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["status", *args, "--json"], env={**CLEAN_ENV, **(env or {})})
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, {row["part"]: row for row in json.loads(result.stdout)}


def path_through(edge_url: str, key: str) -> tuple[int, dict[str, Any]]:
    code, rows = status("--edge-url", edge_url, "--key", key)
    return code, rows["path"]


def test_a_valid_key_reaches_the_origin_through_the_edge(edge: EdgeStack, api_key: str) -> None:
    code, rows = status(
        "--origin-url", edge.origin.url, "--origin-admin-url", edge.origin.admin_url,
        "--edge-url", edge.url, "--key", api_key, "--redis-url", edge.redis_url,
    )  # fmt: skip

    assert code == 0
    assert {part: row["state"] for part, row in rows.items()} == {
        "origin": "ok",
        "edge": "ok",
        "path": "ok",
        "redis": "ok",
    }
    assert rows["path"]["detail"] == "a request with the key reached the origin through the edge"
    assert rows["redis"]["url"].endswith("(--redis-url)")


def test_edge_and_origin_with_different_forward_secrets_are_named(
    edge: EdgeStack, api_key: str
) -> None:
    before = edge.origin.metric("prism_origin_forward_rejected_total", reason="signature")

    code, path = path_through(edge.extra("forward_mismatch"), api_key)

    assert code == 1
    assert path["state"] == "down" and path["code"] == "forward_secret_mismatch"
    assert "edge and origin disagree on PRISM_FORWARD_SECRET" in path["detail"]
    # the origin really refused it (not the edge, which accepted the key)
    assert edge.origin.metric("prism_origin_forward_rejected_total", reason="signature") > before
    # and the client is told it is the gateway's fault, not its key's
    answer = httpx.post(
        edge.extra("forward_mismatch") + "/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "mismatch"}]},
        headers={"authorization": f"Bearer {api_key}"},
        timeout=60,
    )
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "invalid_forward"


def test_an_edge_that_cannot_reach_its_origin_is_named(edge: EdgeStack, api_key: str) -> None:
    code, path = path_through(edge.extra("no_origin"), api_key)

    assert code == 1
    assert path["code"] == "origin_unreachable" and "ORIGIN_URL" in path["detail"]


def test_a_key_of_another_secret_is_named(edge: EdgeStack) -> None:
    other = parse_key_secrets("another-key-secret-0123456789abc").mint("acme")

    code, path = path_through(edge.url, other)

    assert code == 1
    assert path["code"] == "key_invalid" and "PRISM_KEY_SECRET" in path["detail"]


def test_a_revoked_key_is_named(edge: EdgeStack, key_ring: KeyRing) -> None:
    key = key_ring.mint("acme")
    assert path_through(edge.url, key)[1]["state"] == "ok"
    store = KeyStore.from_url(edge.redis_url)
    try:
        store.revoke("acme", key, ring=key_ring)
    finally:
        store.close()

    code, path = path_through(edge.url, key)

    assert code == 1
    assert path["code"] == "key_revoked" and path["detail"] == "the key is revoked"


@pytest.fixture(scope="module")
def tls_origin(
    tmp_path_factory: pytest.TempPathFactory, redis_server: Any, provider_server: ProviderServer
) -> Iterator[str]:
    """The origin served over TLS with a certificate no client trusts (its own CA's)."""
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    settings = Settings.from_env(origin_env(redis_server.url, provider_server.url))
    server = ThreadedServer(
        create_app(settings),
        **server_options(settings),
        ssl_certfile=str(folder / "cert.pem"),
        ssl_keyfile=str(folder / "key.pem"),
    ).start()
    try:
        yield f"https://127.0.0.1:{server.port}"
    finally:
        server.stop()


def test_a_self_signed_origin_is_told_and_checked_with_insecure(tls_origin: str) -> None:
    code, rows = status("--origin-url", tls_origin)

    assert code == 1
    assert rows["origin"]["code"] == "certificate_untrusted"
    assert rows["origin"]["detail"] == (
        "the origin's certificate is not trusted (self-signed?); use --insecure to check anyway"
    )
    code, rows = status("--origin-url", tls_origin, "--insecure")
    assert code == 0 and rows["origin"]["state"] == "ok"
    assert "certificate not verified" in rows["origin"]["detail"]


def test_the_local_stack_is_checked_with_its_own_redis_and_key(
    edge: EdgeStack, tmp_path: Path
) -> None:
    # A `prism dev` state folder for the running stack, and a deployment's Redis and key in
    # the environment: neither may be used for the local stack.
    (tmp_path / "dev.json").write_text(
        json.dumps(
            {
                "origin_url": edge.origin.url,
                "origin_admin_url": edge.origin.admin_url,
                "edge_url": edge.url,
                "redis_url": edge.redis_url,
            }
        )
    )
    (tmp_path / "dev-secrets.json").write_text(json.dumps({"PRISM_KEY_SECRET": KEY_SECRET}))
    port = closed_port()
    elsewhere = f"redis://:hunter2@127.0.0.1:{port}/0"
    env = {"REDIS_URL": elsewhere, "PRISM_API_KEY": "sk-prism-v1.deployed.key"}

    code, rows = status("--state-dir", str(tmp_path), env=env)

    assert code == 0, rows
    assert rows["redis"]["state"] == "ok"
    assert rows["redis"]["url"] == f"{edge.redis_url} (the prism dev stack in {tmp_path})"
    assert rows["path"]["state"] == "ok"  # the dev key, not $PRISM_API_KEY
    # Checking a deployment, $REDIS_URL is the one: said so, password hidden.
    code, rows = status("--edge-url", edge.url, env=env)
    assert code == 1
    assert rows["redis"]["state"] == "down"
    assert rows["redis"]["url"] == f"redis://127.0.0.1:{port}/0 ($REDIS_URL)"
    assert rows["path"]["code"] == "key_invalid"  # $PRISM_API_KEY was used


def test_an_edge_that_is_down_is_one_row(api_key: str) -> None:
    edge_url = f"http://127.0.0.1:{closed_port()}"

    code, rows = status("--edge-url", edge_url, "--key", api_key)

    assert code == 1
    assert list(rows) == ["edge"]  # no path row repeating it
    assert rows["edge"]["code"] == "unreachable"
    assert rows["edge"]["detail"].startswith("cannot connect to the edge")
