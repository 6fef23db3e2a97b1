"""`prism policy set --semantic/--no-semantic --semantic-threshold` against a real Redis and
the KV stand-in: each group of options changes its own part of the policy."""

from __future__ import annotations

import pytest
import redis
from typer.testing import CliRunner, Result

from deploy.cli import app
from prism import DEFAULT_SEMANTIC_THRESHOLD, CacheRules, Policy, policy_key
from tests.fixtures.workers import KVApi

runner = CliRunner()


@pytest.fixture
def env(redis_url: str, kv_api_reset: KVApi) -> dict[str, str]:
    kv_api_reset.bulk_delete([policy_key("acme")])
    return {
        "REDIS_URL": redis_url,
        "PRISM_KV_API_URL": kv_api_reset.url,
        "PRISM_KV_ACCOUNT_ID": kv_api_reset.account_id,
        "PRISM_KV_NAMESPACE_ID": kv_api_reset.namespace_id,
        "CLOUDFLARE_API_TOKEN": kv_api_reset.api_token,
    }


def policy(env: dict[str, str], *args: str) -> Result:
    return runner.invoke(app, ["policy", *args], env=env)


def stored(redis_url: str) -> Policy | None:
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.get(policy_key("acme"))
        return None if raw is None else Policy.parse(raw)
    finally:
        client.close()


def test_semantic_turns_on_with_the_default_threshold_and_reaches_kv(
    env: dict[str, str], redis_url: str, kv_api_reset: KVApi
) -> None:
    result = policy(env, "set", "--project", "acme", "--semantic")
    assert result.exit_code == 0, result.output
    assert f"semantic cache on (threshold {DEFAULT_SEMANTIC_THRESHOLD})" in result.stdout
    after = stored(redis_url)
    assert after is not None and after.cache == CacheRules(True, DEFAULT_SEMANTIC_THRESHOLD)
    assert (after.allow, after.deny) == ((), ())
    published = kv_api_reset.get(policy_key("acme"))
    assert published is not None and Policy.parse(published) == after


def test_each_group_of_options_keeps_the_others(env: dict[str, str], redis_url: str) -> None:
    assert policy(env, "set", "--project", "acme", "--allow", "gpt-4o*", "--no-kv").exit_code == 0
    result = policy(
        env, "set", "--project", "acme", "--semantic", "--semantic-threshold", "0.96", "--no-kv"
    )
    assert result.exit_code == 0, result.output
    after = stored(redis_url)
    assert after is not None
    assert after.allow == ("gpt-4o*",) and after.cache == CacheRules(True, 0.96)
    assert policy(env, "set", "--project", "acme", "--deny", "o1*", "--no-kv").exit_code == 0
    after = stored(redis_url)
    assert after is not None
    assert (after.allow, after.deny) == ((), ("o1*",))  # --allow/--deny replace both lists
    assert after.cache == CacheRules(True, 0.96)  # the cache options stay
    assert policy(env, "set", "--project", "acme", "--no-semantic", "--no-kv").exit_code == 0
    after = stored(redis_url)
    assert after is not None and after.cache == CacheRules(False, 0.96)
    assert after.deny == ("o1*",) and after.revision == 4


@pytest.mark.parametrize("threshold", ["0.5", "1.2", "0.899"])
def test_a_threshold_out_of_range_is_refused_and_changes_nothing(
    env: dict[str, str], redis_url: str, threshold: str
) -> None:
    assert policy(env, "set", "--project", "acme", "--semantic", "--no-kv").exit_code == 0
    before = stored(redis_url)
    result = policy(env, "set", "--project", "acme", "--semantic-threshold", threshold, "--no-kv")
    assert result.exit_code == 2
    assert "cache.threshold: must be a number from 0.9 to 0.99" in result.output
    assert stored(redis_url) == before


def test_set_with_no_option_at_all_is_refused(env: dict[str, str], redis_url: str) -> None:
    result = policy(env, "set", "--project", "acme")
    assert result.exit_code == 2 and "--semantic" in result.output
    assert stored(redis_url) is None
