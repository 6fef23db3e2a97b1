"""`prism policy set --semantic/--no-semantic --semantic-threshold` against a real Redis and
the KV stand-in: the cache options are part of the policy `set` replaces."""

from __future__ import annotations

import pytest
import redis

from prism import DEFAULT_SEMANTIC_THRESHOLD, CacheRules, Policy, policy_key
from tests.fixtures.cli import policy
from tests.fixtures.workers import KVApi


def stored(redis_url: str) -> Policy | None:
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.get(policy_key("acme"))
        return None if raw is None else Policy.parse(raw)
    finally:
        client.close()


def test_semantic_turns_on_with_the_default_threshold_and_reaches_kv(
    policy_env: dict[str, str], redis_url: str, kv_api_reset: KVApi
) -> None:
    result = policy(policy_env, "set", "--project", "acme", "--semantic")
    assert result.exit_code == 0, result.output
    assert f"semantic cache on (threshold {DEFAULT_SEMANTIC_THRESHOLD})" in result.stdout
    after = stored(redis_url)
    assert after is not None and after.cache == CacheRules(True, DEFAULT_SEMANTIC_THRESHOLD)
    assert (after.allow, after.deny) == ((), ())
    published = kv_api_reset.get(policy_key("acme"))
    assert published is not None and Policy.parse(published) == after


def test_set_replaces_the_whole_policy_cache_options_included(
    policy_env: dict[str, str], redis_url: str
) -> None:
    result = policy(
        policy_env, "set", "--project", "acme", "--allow", "gpt-4o*", "--budget", "25",
        "--semantic", "--semantic-threshold", "0.96", "--no-kv",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "budget $25.0 per UTC month; semantic cache on (threshold 0.96)" in result.stdout
    after = stored(redis_url)
    assert after is not None
    assert after.allow == ("gpt-4o*",) and after.cache == CacheRules(True, 0.96)
    assert (
        policy(policy_env, "set", "--project", "acme", "--allow", "gpt-4o*", "--no-kv").exit_code
        == 0
    )
    after = stored(redis_url)
    assert after is not None and after.cache is None and after.revision == 2  # off again
    assert (
        policy(
            policy_env, "set", "--project", "acme", "--deny", "o1*", "--no-semantic", "--no-kv"
        ).exit_code
        == 0
    )
    after = stored(redis_url)
    assert after is not None and after.cache is None and after.deny == ("o1*",)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--semantic", "--semantic-threshold", "-0.5"], "cache.threshold: must be a number from 0.0 to 1.0"),
        (["--semantic", "--semantic-threshold", "1.2"], "cache.threshold: must be a number from 0.0 to 1.0"),
        (["--semantic", "--semantic-threshold", "1.001"], "cache.threshold: must be a number from 0.0"),
        (["--allow", "x", "--semantic-threshold", "0.95"], "--semantic-threshold needs --semantic"),
        (["--no-semantic"], "give at least one --allow, --deny or --budget, or --semantic"),
        ([], "give at least one --allow, --deny or --budget, or --semantic"),
    ],
)  # fmt: skip
def test_bad_semantic_options_are_refused_and_change_nothing(
    policy_env: dict[str, str], redis_url: str, args: list[str], message: str
) -> None:
    assert policy(policy_env, "set", "--project", "acme", "--semantic", "--no-kv").exit_code == 0
    before = stored(redis_url)
    result = policy(policy_env, "set", "--project", "acme", *args, "--no-kv")
    assert result.exit_code == 2
    assert message in result.output
    assert stored(redis_url) == before
