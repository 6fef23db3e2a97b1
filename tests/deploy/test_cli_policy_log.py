"""`prism policy set --log-bodies --redact-emails` against a real Redis and the KV
stand-in: the request log's options are part of the policy `set` replaces."""

from __future__ import annotations

import pytest
import redis

from prism import LogRules, Policy, policy_key
from tests.fixtures.cli import policy
from tests.fixtures.workers import KVApi


def stored(redis_url: str) -> Policy | None:
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.get(policy_key("acme"))
        return None if raw is None else Policy.parse(raw)
    finally:
        client.close()


def test_log_bodies_turns_on_and_reaches_kv(
    policy_env: dict[str, str], redis_url: str, kv_api_reset: KVApi
) -> None:
    result = policy(policy_env, "set", "--project", "acme", "--log-bodies", "--redact-emails")
    assert result.exit_code == 0, result.output
    assert "bodies logged (redacted, emails too)" in result.stdout
    after = stored(redis_url)
    assert after is not None and after.log == LogRules(bodies=True, redact_emails=True)
    published = kv_api_reset.get(policy_key("acme"))
    assert published is not None and Policy.parse(published) == after

    again = policy(policy_env, "set", "--project", "acme", "--allow", "gpt-*", "--no-kv")
    assert again.exit_code == 0, again.output
    replaced = stored(redis_url)
    assert replaced is not None and replaced.log is None  # set replaces the whole policy


def test_redact_emails_needs_log_bodies(policy_env: dict[str, str], redis_url: str) -> None:
    result = policy(policy_env, "set", "--project", "acme", "--redact-emails", "--no-kv")
    assert result.exit_code == 2 and "--redact-emails needs --log-bodies" in result.output
    assert stored(redis_url) is None


def test_an_unknown_log_option_is_refused_when_parsed() -> None:
    with pytest.raises(ValueError, match=r"log\.everything: unknown field"):
        Policy.parse('{"log": {"everything": true}}')
    assert Policy.parse('{"log": {"bodies": true}}').log == LogRules(bodies=True)
