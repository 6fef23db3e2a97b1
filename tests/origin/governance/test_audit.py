"""The audit log: key and policy changes from the CLI, policy refusals from the origin, one
hash chain in a real Redis that `prism audit --verify` checks, and that detects a record
changed, deleted or cut off by hand."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner, Result

from deploy import audit_log
from deploy.cli import app
from origin.connection.redis_pipe import RedisPipe
from origin.governance.audit import (
    AUDIT_HEAD,
    AUDIT_STREAM,
    AuditWriter,
    audit_record,
    record_hash,
    seal,
)
from prism import KeyRing
from tests.fixtures.origin import KEY_SECRET, RunningOrigin
from tests.fixtures.stacks import CLI_START
from tests.polling import wait_for

runner = CliRunner()


@pytest.fixture
def env(redis_url: str) -> dict[str, str]:
    return {"REDIS_URL": redis_url, "PRISM_KEY_SECRET": KEY_SECRET}


@pytest.fixture
def admin(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, decode_responses=True)


def cli(env: dict[str, str], *args: str) -> Result:
    return runner.invoke(app, list(args), env=env)


def records(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    result = cli(env, "audit", "--json", *args)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def make_history(env: dict[str, str]) -> None:
    created = cli(env, "keys", "create", "--project", "acme", "--created-by", "alice", "--json")
    assert created.exit_code == 0, created.output
    key_id = json.loads(created.stdout)["key_id"]
    for args in (
        ["policy", "set", "-p", "acme", "--deny", "o1*", "--by", "bob", "--no-kv"],
        ["policy", "set", "-p", "globex", "--allow", "gpt-4o*", "--by", "carol", "--no-kv"],
        ["policy", "set", "-p", "acme", "--deny", "o3*", "--by", "bob", "--no-kv"],
        ["keys", "revoke", key_id, "--project", "acme", "--no-kv"],
        ["policy", "clear", "-p", "acme", "--by", "dave", "--no-kv"],
    ):
        assert cli(env, *args).exit_code == 0


def test_every_change_is_recorded_with_who_before_and_after(env: dict[str, str]) -> None:
    make_history(env)
    log = records(env)
    assert [(r["action"], r["project"], r["actor"]) for r in log] == [
        ("key.create", "acme", "alice"),
        ("policy.set", "acme", "bob"),
        ("policy.set", "globex", "carol"),
        ("policy.set", "acme", "bob"),
        ("key.revoke", "acme", log[4]["actor"]),  # the login name of whoever runs the tests
        ("policy.clear", "acme", "dave"),
    ]
    assert log[0]["before"] == "" and json.loads(log[0]["after"])["name"] is None
    assert "key" not in json.loads(log[0]["after"])  # the key itself is never recorded
    assert json.loads(log[3]["before"])["deny"] == ["o1*"]
    assert json.loads(log[3]["after"])["deny"] == ["o3*"]
    assert json.loads(log[4]["before"])["revoked_at"] is None
    assert json.loads(log[4]["after"])["revoked_at"] is not None
    assert json.loads(log[5]["before"])["deny"] == ["o3*"] and log[5]["after"] == ""
    assert [r["prev"] for r in log[1:]] == [r["hash"] for r in log[:-1]]
    assert [r["action"] for r in records(env, "--project", "globex")] == ["policy.set"]
    text = cli(env, "audit", "--project", "acme")
    assert "policy.set" in text.stdout and "deny ['o3*']" in text.stdout
    verified = cli(env, "audit", "--verify")
    assert verified.exit_code == 0 and "intact: 6 record(s)" in verified.stdout


def test_an_invalid_policy_or_a_repeated_revoke_writes_no_record(env: dict[str, str]) -> None:
    assert cli(env, "policy", "set", "-p", "acme", "--deny", "bad pattern").exit_code == 2
    assert records(env) == []
    created = cli(env, "keys", "create", "--project", "acme", "--json")
    key_id = json.loads(created.stdout)["key_id"]
    for _ in range(2):
        assert cli(env, "keys", "revoke", key_id, "--project", "acme", "--no-kv").exit_code == 0
    assert [r["action"] for r in records(env)] == ["key.create", "key.revoke"]


def _rewrite(admin: redis.Redis, change: Any) -> list[tuple[str, dict[str, str]]]:
    """Rewrite the stream by hand, keeping every id: ``change(index, fields)`` per record."""
    original = list(audit_log.read(admin))
    admin.delete(AUDIT_STREAM)
    for index, (record_id, fields) in enumerate(original):
        admin.xadd(AUDIT_STREAM, change(index, dict(fields)), id=record_id)
    return original


def _broken(env: dict[str, str]) -> dict[str, Any]:
    result = cli(env, "audit", "--verify", "--json")
    assert result.exit_code == 1, result.output
    broken: dict[str, Any] = json.loads(result.stdout)["broken"]
    text = cli(env, "audit", "--verify")
    assert text.exit_code == 1 and f"BROKEN at record {broken['id'] or '(end)'}" in text.stderr
    return broken


def test_verify_names_a_record_changed_by_hand(env: dict[str, str], admin: redis.Redis) -> None:
    make_history(env)

    def edit(index: int, fields: dict[str, str]) -> dict[str, str]:
        if index == 1:
            fields["after"] = fields["after"].replace("o1*", "nothing")  # hide what bob did
        return fields

    original = _rewrite(admin, edit)
    broken = _broken(env)
    assert broken["id"] == original[1][0] and "was changed" in broken["reason"]


def test_verify_names_the_record_after_one_rehashed_by_hand(
    env: dict[str, str], admin: redis.Redis
) -> None:
    make_history(env)

    def forge(index: int, fields: dict[str, str]) -> dict[str, str]:
        if index == 2:
            fields["actor"] = "mallory"
            fields["hash"] = record_hash(fields)  # a careful forger rehashes the record
        return fields

    original = _rewrite(admin, forge)
    broken = _broken(env)
    assert broken["id"] == original[3][0] and "prev does not match" in broken["reason"]


def test_verify_detects_a_deleted_record_and_a_cut_end(
    env: dict[str, str], admin: redis.Redis
) -> None:
    make_history(env)
    ids = [record_id for record_id, _ in audit_log.read(admin)]
    admin.xdel(AUDIT_STREAM, ids[2])
    broken = _broken(env)
    assert broken["id"] == ids[3] and "deleted" in broken["reason"]
    admin.delete(AUDIT_STREAM, AUDIT_HEAD)
    make_history(env)
    ids = [record_id for record_id, _ in audit_log.read(admin)]
    admin.xdel(AUDIT_STREAM, ids[-1])
    broken = _broken(env)
    assert broken["id"] == ids[-2] and "records after it were deleted" in broken["reason"]


def test_concurrent_writers_never_fork_the_chain(redis_url: str, admin: redis.Redis) -> None:
    def cli_writer(n: int) -> None:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        for i in range(20):
            audit_log.append(client, audit_record("policy.set", f"p{n}", f"w{n}", after={"i": i}))
        client.close()

    async def origin_writers() -> None:
        pipe = RedisPipe(redis_url, 5.0)
        writers = [AuditWriter(pipe), AuditWriter(pipe)]  # as two origin processes would
        jobs = []
        for i in range(20):
            for n, writer in enumerate(writers):
                assert writer.admit()
                jobs.append(
                    writer.append(audit_record("policy.refuse", f"o{n}", "k", detail={"i": i}))
                )
        await asyncio.gather(*jobs)
        assert [w.dropped for w in writers] == [0, 0]
        await pipe.close()

    threads = [threading.Thread(target=cli_writer, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    asyncio.run(origin_writers())
    for thread in threads:
        thread.join()
    count, broken = audit_log.verify(admin)
    assert broken is None and count == 3 * 20 + 2 * 20


def test_the_origin_records_a_policy_refusal_off_the_request_path(
    origin: RunningOrigin, api_key: str, key_ring: KeyRing, admin: redis.Redis, env: dict[str, str]
) -> None:
    assert cli(env, "policy", "set", "-p", "acme", "--deny", "o1*", "--no-kv").exit_code == 0
    model = f"o1-{secrets.token_hex(3)}"
    refused = httpx.post(
        origin.url + "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {api_key}"},
    )
    assert refused.status_code == 403
    log = wait_for(lambda: [r for r in records(env) if r["action"] == "policy.refuse"])
    assert log[0]["project"] == "acme"
    assert log[0]["actor"] == f"key:{key_ring.verify(api_key).key_id}"
    assert json.loads(log[0]["detail"]) == {"model": model, "code": "model_not_allowed"}
    verified = cli(env, "audit", "--verify")
    assert verified.exit_code == 0, verified.output  # the CLI's and the origin's records chain


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--follow", "--verify"], "--follow and --verify do not go together"),
        (["--project", "Not A Project"], "is not a project id"),
    ],
)
def test_bad_input_to_audit_is_one_line(env: dict[str, str], args: list[str], message: str) -> None:
    result = cli(env, "audit", *args)
    assert result.exit_code == 2 and message in result.stderr


def test_seal_chains_and_hashes_every_field_but_hash() -> None:
    first = seal({"action": "a", "project": "p"}, "0" * 64)
    second = seal({"action": "b", "project": "p"}, first["hash"])
    assert second["prev"] == first["hash"] and record_hash(second) == second["hash"]
    assert record_hash({**second, "project": "q"}) != second["hash"]


@pytest.mark.timeout(300)  # a `prism` process's start-up (CLI_START), on a slow machine
def test_follow_prints_records_as_they_arrive(redis_url: str, admin: redis.Redis) -> None:
    import queue
    import subprocess
    import sys

    audit_log.append(admin, audit_record("policy.set", "acme", "before-follow"))
    process = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "audit", "--follow", "--json", "-p", "acme"],
        stdout=subprocess.PIPE,
        text=True,
        env={"REDIS_URL": redis_url, "PATH": "/usr/bin:/bin"},
    )
    lines: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    assert stdout is not None

    def read() -> None:
        for line in stdout:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert json.loads(lines.get(timeout=CLI_START))["actor"] == "before-follow"
        audit_log.append(admin, audit_record("policy.set", "globex", "elsewhere"))  # filtered
        audit_log.append(admin, audit_record("policy.clear", "acme", "while-following"))
        followed = json.loads(lines.get(timeout=30))
        assert (followed["action"], followed["actor"]) == ("policy.clear", "while-following")
    finally:
        process.terminate()
        process.wait(timeout=10)
