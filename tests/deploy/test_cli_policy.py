"""`prism policy set | show | clear | sync` against a real Redis and the KV stand-in."""

from __future__ import annotations

import json

import pytest
import redis
from typer.testing import CliRunner

from deploy.cli import app
from prism import Budget, Policy, policy_key
from tests.fixtures.cli import policy
from tests.fixtures.workers import KVApi
from tests.redis_replies import reply_as, stream_fields

runner = CliRunner()


def in_redis(redis_url: str, project: str = "acme") -> bytes | None:
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.get(policy_key(project))
        return None if raw is None else reply_as(bytes, raw)
    finally:
        client.close()


def test_set_show_clear_reach_redis_and_kv(
    policy_env: dict[str, str], redis_url: str, kv_api_reset: KVApi
) -> None:
    result = policy(
        policy_env, "set", "--project", "acme", "--allow", "gpt-4o*", "--allow", "demo",
        "--deny", "o1*", "--by", "ops",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "allow gpt-4o*, demo; deny o1* (revision 1)" in result.stdout
    assert "within about a minute" in result.stdout
    stored = in_redis(redis_url)
    assert stored is not None
    first = Policy.parse(stored)
    assert (first.allow, first.deny, first.revision, first.updated_by) == (
        ("gpt-4o*", "demo"),
        ("o1*",),
        1,
        "ops",
    )
    assert stored == first.encode()  # canonical
    assert kv_api_reset.get_text(policy_key("acme")) == stored.decode()  # the edge's copy

    shown = policy(policy_env, "show", "--project", "acme", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["policy"] == first.to_dict()

    second = policy(policy_env, "set", "-p", "acme", "--deny", "gpt-4o-mini", "--json")
    assert second.exit_code == 0, second.output
    change = json.loads(second.stdout)
    assert change["before"] == first.to_dict()
    assert change["after"]["deny"] == ["gpt-4o-mini"] and change["after"]["allow"] == []
    assert change["after"]["revision"] == 2
    assert change["edge"] == {"published": True, "skipped": False, "error": None}

    cleared = policy(policy_env, "clear", "--project", "acme")
    assert cleared.exit_code == 0, cleared.output
    assert in_redis(redis_url) is None
    assert Policy.parse(kv_api_reset.get_text(policy_key("acme")) or "") == Policy()
    text = policy(policy_env, "show", "--project", "acme")
    assert "none (every model is allowed)" in text.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["set", "--project", "Acme!", "--deny", "o1*"], "--project: 'Acme!' is not a project id"),
        (["set", "--project", "acme"], "give at least one --allow, --deny or --budget, or --semantic, or a rate limit option"),
        (["set", "--project", "acme", "--budget", "-5"], "invalid policy: budget.usd: must be above 0"),
        (["set", "--project", "acme", "--budget", "0"], "invalid policy: budget.usd: must be above 0"),
        (["set", "--project", "acme", "--budget", "ten"], "--budget must be a number of US dollars, got 'ten'"),
        (["set", "--project", "acme", "--budget", "nan"], "invalid policy: budget.usd: must be a number"),
        (["set", "--project", "acme", "--budget", "1e12"], "budget.usd: must be above 0 and at most"),
        (["set", "--project", "acme", "--budget", "0.0000001"], "budget.usd: must be at least 0.000001"),
        (["set", "--project", "acme", "--budget", "5", "--period", "week"], "--period must be day or month"),
        (["set", "--project", "acme", "--deny", "o1", "--period", "day"], "--period needs --budget"),
        (["set", "--project", "acme", "--rpm", "0"], "invalid policy: --rpm: must be between 1 and 1,000,000 (got 0)"),
        (["set", "--project", "acme", "--key-tpm", "2000000000"], "--key-tpm: must be between 1 and 1,000,000,000"),
        (["set", "--project", "acme", "--key-limit", "abc"], "--key-limit: 'abc' is not KEY_ID:rpm=N[,tpm=N]"),
        (["set", "--project", "acme", "--key-limit", "short:rpm=5"], "rate_limits.keys: 'short' is not a key id"),
        (["set", "--project", "acme", "--key-limit", "abcdefgh:rps=5"], "--key-limit abcdefgh.rps: unknown field"),
        (["set", "--project", "acme", "--allow", ""], "invalid policy: allow[0]: must be a non-empty"),
        (["set", "--project", "acme", "--deny", "o1 *"], "invalid policy: deny[0]: 'o1 *' has whitespace"),
        (["set", "--project", "acme", *[a for i in range(65) for a in ("--deny", f"m{i}")]], "deny: at most 64"),
        (["set", "--project", "acme", "--allow", "x" * 201], "allow[0]: at most 200 characters"),
        (["set", "--project", "acme", "--by", "\x07", "--deny", "o1"], "updated_by: must be at most"),
        (["show", "--project", ""], "--project: '' is not a project id"),
        (["clear", "--project", "a" * 64], "is not a project id"),
    ],
)  # fmt: skip
def test_bad_input_is_one_clear_line_and_changes_nothing(
    policy_env: dict[str, str], redis_url: str, kv_api_reset: KVApi, args: list[str], message: str
) -> None:
    assert policy(policy_env, "set", "--project", "acme", "--deny", "keep*").exit_code == 0
    before_redis, before_kv = in_redis(redis_url), kv_api_reset.get_text(policy_key("acme"))
    result = policy(policy_env, *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert in_redis(redis_url) == before_redis
    assert kv_api_reset.get_text(policy_key("acme")) == before_kv


def test_a_budget_is_set_shown_published_and_audited(
    policy_env: dict[str, str], redis_url: str, kv_api_reset: KVApi
) -> None:
    result = policy(
        policy_env, "set", "-p", "acme", "--deny", "o1*", "--budget", "$1,250.5", "--period", "day",
        "--by", "ops",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "deny o1*; budget $1,250.5 per UTC day (revision 1)" in result.stdout
    stored = Policy.parse(in_redis(redis_url) or b"")
    assert stored.budget == Budget(1250.5, "day") and stored.deny == ("o1*",)
    assert kv_api_reset.get_text(policy_key("acme")) == stored.encode().decode()
    shown = json.loads(policy(policy_env, "show", "-p", "acme", "--json").stdout)
    assert shown["policy"]["budget"] == {"period": "day", "usd": 1250.5}
    monthly = policy(policy_env, "set", "-p", "acme", "--budget", "10", "--json")  # replaces all
    after = json.loads(monthly.stdout)["after"]
    assert after["budget"] == {"period": "month", "usd": 10.0} and after["deny"] == []

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        records = stream_fields(str, client.xrange("prism:audit"))
    finally:
        client.close()
    sets = [r for r in records if r["action"] == "policy.set"]
    assert json.loads(sets[0]["after"])["budget"] == {"period": "day", "usd": 1250.5}
    assert json.loads(sets[1]["before"])["budget"] == {"period": "day", "usd": 1250.5}
    audit = runner.invoke(app, ["audit", "--project", "acme"], env=policy_env)
    assert "budget $10.0/month" in audit.stdout


def test_without_kv_settings_redis_is_saved_and_the_command_says_the_edge_was_not_told(
    redis_url: str,
) -> None:
    env = {"REDIS_URL": redis_url, "PRISM_KV_ACCOUNT_ID": "", "PRISM_KV_NAMESPACE_ID": ""}
    result = policy(env, "set", "--project", "acme", "--deny", "o1*")
    assert result.exit_code == 1
    assert "the edge was not told" in result.stderr and "prism policy sync" in result.stderr
    assert in_redis(redis_url) is not None
    origin_only = policy(env, "set", "--project", "acme", "--deny", "o3*", "--no-kv")
    assert origin_only.exit_code == 0, origin_only.output


def test_sync_republishes_the_redis_record(
    policy_env: dict[str, str], redis_url: str, kv_api_reset: KVApi
) -> None:
    assert policy(policy_env, "set", "--project", "acme", "--deny", "o1*").exit_code == 0
    kv_api_reset.bulk_delete([policy_key("acme")])  # as if the KV write had failed
    assert policy(policy_env, "sync", "--project", "acme").exit_code == 0
    assert kv_api_reset.get_text(policy_key("acme")) == (in_redis(redis_url) or b"").decode()


def test_an_unreachable_redis_is_one_line(policy_env: dict[str, str]) -> None:
    from deploy.local.ports import free_port

    env = {**policy_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    result = policy(env, "show", "--project", "acme")
    assert result.exit_code == 1
    assert "cannot reach Redis" in result.stderr and "Traceback" not in result.stderr


def test_rate_limits_are_set_shown_replaced_and_removed(
    policy_env: dict[str, str], redis_url: str, kv_api_reset: KVApi
) -> None:
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    result = policy(
        policy_env, "set", "--project", "acme", "--deny", "o1*", "--rpm", "600", "--tpm", "200000",
        "--key-rpm", "60", "--key-limit", "bigkey01:rpm=120,tpm=50000", "--by", "ops",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (
        "deny o1*; rate limits project 600 rpm and 200,000 tpm; each key 60 rpm; "
        "key bigkey01 120 rpm and 50,000 tpm" in result.stdout
    )
    stored = Policy.parse(in_redis(redis_url) or b"")
    assert stored.deny == ("o1*",)
    assert stored.rate_limits is not None
    assert stored.rate_limits.to_dict() == {
        "project": {"rpm": 600, "tpm": 200000},
        "key": {"rpm": 60},
        "keys": {"bigkey01": {"rpm": 120, "tpm": 50000}},
    }
    # The lookup script's compact form, written with the record.
    assert admin.hgetall("prism:limits:acme") == {
        "rpm": "600",
        "tpm": "200000",
        "key.rpm": "60",
        "id.bigkey01.rpm": "120",
        "id.bigkey01.tpm": "50000",
    }
    assert kv_api_reset.get_text(policy_key("acme")) == stored.encode().decode()

    shown = policy(policy_env, "show", "--project", "acme", "--json")
    assert json.loads(shown.stdout)["policy"]["rate_limits"]["key"] == {"rpm": 60}

    # The origin's state of a limit (fields "s.*") survives a change of the limits.
    admin.hset("prism:limits:acme", "s.rpm", "1764800000000000")
    assert policy(policy_env, "set", "--project", "acme", "--key-tpm", "1000").exit_code == 0
    assert admin.hgetall("prism:limits:acme") == {"key.tpm": "1000", "s.rpm": "1764800000000000"}
    last = stream_fields(str, admin.xrevrange("prism:audit", count=1))[0]
    assert last["action"] == "policy.set"
    assert json.loads(last["before"])["rate_limits"] == stored.rate_limits.to_dict()
    assert json.loads(last["after"])["rate_limits"] == {"key": {"tpm": 1000}}
    assert "rate limits" in policy(policy_env, "show", "--project", "acme").stdout

    # `set` replaces the whole policy: without rate limit options, none; the hash goes.
    replaced = policy(policy_env, "set", "--project", "acme", "--allow", "gpt-*", "--json")
    assert replaced.exit_code == 0, replaced.output
    assert "rate_limits" not in json.loads(replaced.stdout)["after"]
    assert admin.exists("prism:limits:acme") == 0
    assert policy(policy_env, "set", "--project", "acme", "--rpm", "5").exit_code == 0
    assert policy(policy_env, "clear", "--project", "acme").exit_code == 0
    assert admin.exists("prism:limits:acme") == 0
