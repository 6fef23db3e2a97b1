"""`prism keys create | revoke | list | sync` against a real Redis, the KV stand-in and the origin."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
import redis
from typer.testing import CliRunner, Result

from deploy.cli import app
from deploy.local.ports import free_port
from deploy.revocation_publisher import KVRevocationPublisher
from prism import REVOKED_KEY, KeyRing
from tests.fixtures.cli import cli_env
from tests.fixtures.origin import KEY_SECRET, OriginFactory
from tests.fixtures.workers import KVApi

runner = CliRunner()
BODY = {"model": "demo", "messages": [{"role": "user", "content": "managed keys"}]}


@pytest.fixture
def env(redis_url: str, kv_api_reset: KVApi) -> dict[str, str]:
    # COLUMNS: rich would otherwise squeeze the table to 80 columns.
    return cli_env(redis_url, kv_api_reset, PRISM_KEY_SECRET=KEY_SECRET, COLUMNS="200")


def keys(env: dict[str, str], *args: str) -> Result:
    return runner.invoke(app, ["keys", *args], env=env)


def create(env: dict[str, str], name: str, project: str = "acme") -> dict[str, str]:
    result = keys(env, "create", "--project", project, "--name", name, "--json")
    assert result.exit_code == 0, result.output
    created: dict[str, str] = json.loads(result.stdout)
    return created


def chat(url: str, key: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json=BODY,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


def kv_revoked(kv_api: KVApi) -> list[str]:
    raw = kv_api.get_text(REVOKED_KEY)
    return json.loads(raw) if raw else []


def revoked_in_redis(redis_url: str, key_id: str) -> bool:
    client = redis.Redis.from_url(redis_url)
    try:
        return bool(client.sismember(REVOKED_KEY, key_id))
    finally:
        client.close()


def test_create_list_revoke_reaches_redis_kv_and_the_origin(
    env: dict[str, str], redis_url: str, kv_api_reset: KVApi, origin_factory: OriginFactory
) -> None:
    text = keys(env, "create", "-p", "acme", "--name", "ci")
    assert text.exit_code == 0, text.output
    doomed = text.stdout.strip()
    assert doomed.startswith("sk-prism-v1.acme.") and "\n" not in doomed
    assert "cannot be shown again" in text.stderr
    kept = create(env, "laptop")

    listed = keys(env, "list", "--project", "acme")
    assert listed.exit_code == 0, listed.output
    doomed_id = doomed.split(".")[2]
    for key in (doomed, kept["key"]):
        signature = key.rsplit(".", 1)[1]
        assert key not in listed.output and signature not in listed.output
    assert doomed_id in listed.stdout and kept["key_id"] in listed.stdout
    assert "ci" in listed.stdout and "laptop" in listed.stdout

    records = json.loads(keys(env, "list", "-p", "acme", "--json").stdout)
    by_name = {r["name"]: r for r in records}
    assert sorted(by_name) == ["ci", "laptop"]
    assert by_name["ci"]["key_hash"] == hashlib.sha256(doomed.encode()).hexdigest()
    assert not any("key" in r for r in records)  # key_id and key_hash only, no key
    assert doomed not in json.dumps(records) and doomed.rsplit(".", 1)[1] not in json.dumps(records)

    revoked = keys(env, "revoke", doomed_id, "--project", "acme")
    assert revoked.exit_code == 0, revoked.output
    assert "within about a minute" in revoked.stdout
    assert revoked_in_redis(redis_url, doomed_id)
    assert kv_revoked(kv_api_reset) == [doomed_id]
    after = {r["name"]: r for r in json.loads(keys(env, "list", "-p", "acme", "--json").stdout)}
    assert after["ci"]["revoked_at"] is not None and after["laptop"]["revoked_at"] is None

    origin = origin_factory()
    refused = chat(origin.url, doomed)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "key_revoked"
    assert chat(origin.url, kept["key"]).status_code == 200


def test_revoke_by_full_key_and_unknown_ids(
    env: dict[str, str], redis_url: str, key_ring: KeyRing
) -> None:
    created = create(env, "ci")
    by_key = keys(env, "revoke", created["key"], "-p", "acme", "--json")
    assert by_key.exit_code == 0, by_key.output
    assert json.loads(by_key.stdout)["revoked"]["key_id"] == created["key_id"]
    assert created["key"] not in by_key.output

    unknown = keys(env, "revoke", "0123456789abcdef", "-p", "acme")
    assert unknown.exit_code == 1 and "no key with id" in unknown.stderr
    wrong_project = keys(env, "revoke", created["key_id"], "-p", "other")
    assert wrong_project.exit_code == 1 and "Traceback" not in wrong_project.output

    # Minted offline (never registered): accepted because the secret verifies it.
    offline = key_ring.mint("acme")
    adopted = keys(env, "revoke", offline, "-p", "acme")
    assert adopted.exit_code == 0, adopted.output
    assert revoked_in_redis(redis_url, key_ring.verify(offline).key_id)
    without_secret = keys(
        {**env, "PRISM_KEY_SECRET": ""}, "revoke", key_ring.mint("acme"), "-p", "acme"
    )
    assert without_secret.exit_code == 1 and "PRISM_KEY_SECRET" in without_secret.stderr


def test_kv_failure_keeps_redis_revocation_and_sync_repairs_the_edge(
    env: dict[str, str], redis_url: str, kv_api_reset: KVApi
) -> None:
    created = create(env, "ci")
    kv_api_reset.fail_next(500, count=10, endpoints=["value_put"])
    result = keys(env, "revoke", created["key_id"], "-p", "acme")
    assert result.exit_code == 1
    assert revoked_in_redis(redis_url, created["key_id"])
    warning = result.stderr.strip()
    assert "\n" not in warning and "Traceback" not in result.output
    assert "revoked in Redis" in warning and "prism keys sync" in warning and "HTTP 500" in warning
    assert created["key_id"] not in kv_revoked(kv_api_reset)

    kv_api_reset.clear_faults()
    synced = keys(env, "sync")
    assert synced.exit_code == 0, synced.output
    assert kv_revoked(kv_api_reset) == [created["key_id"]]


def test_revoke_without_kv_settings_warns_unless_no_kv(env: dict[str, str]) -> None:
    created = create(env, "ci")
    bare = {k: v for k, v in env.items() if not k.startswith("PRISM_KV_")}
    warned = keys(bare, "revoke", created["key_id"], "-p", "acme")
    assert warned.exit_code == 1 and "PRISM_KV_ACCOUNT_ID" in warned.stderr
    assert keys(bare, "revoke", created["key_id"], "-p", "acme", "--no-kv").exit_code == 0


@pytest.mark.parametrize(
    "args",
    [
        ["create", "-p", "acme"],
        ["list", "-p", "acme"],
        ["revoke", "0123456789abcdef", "-p", "acme"],
        ["sync"],
    ],
)
def test_unreachable_redis_is_one_line_and_exit_1(args: list[str]) -> None:
    env = {"PRISM_KEY_SECRET": KEY_SECRET, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    env.update({"PRISM_KV_ACCOUNT_ID": "a", "PRISM_KV_NAMESPACE_ID": "n"})
    result = keys(env, *args)
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)
    assert result.stderr.count("\n") == 1 and "cannot reach Redis" in result.stderr
    assert "Traceback" not in result.output


def test_publisher_honours_retry_after_and_does_not_retry_a_rejected_token(
    kv_api_reset: KVApi,
) -> None:
    kv = kv_api_reset
    kv.fail_next(429, count=1, retry_after=3, endpoints=["value_put"])
    slept: list[float] = []
    publisher = KVRevocationPublisher(
        kv.url, kv.account_id, kv.namespace_id, kv.api_token, sleep=slept.append
    )
    assert publisher.publish(["b1234567", "a1234567"])
    assert json.loads(kv.get_text(REVOKED_KEY) or "null") == ["a1234567", "b1234567"]
    assert len(slept) == 1 and slept[0] >= 3  # one retry, after Retry-After, not the backoff

    rejected = KVRevocationPublisher(
        kv.url, kv.account_id, kv.namespace_id, "not-the-token", sleep=slept.append
    )
    assert not rejected.publish(["c1234567"])
    assert rejected.last_error is not None and rejected.last_error.startswith("HTTP 403")
    assert len(slept) == 1  # a rejected token is not retried
    assert json.loads(kv.get_text(REVOKED_KEY) or "null") == ["a1234567", "b1234567"]
