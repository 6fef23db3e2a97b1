"""The policy's ``cache`` options: the semantic cache's opt-in and threshold, validated,
canonical, and absent from records that do not set them."""

from __future__ import annotations

import json

import pytest

from prism import DEFAULT_SEMANTIC_THRESHOLD, CacheRules, Policy


def test_cache_options_round_trip_canonically() -> None:
    policy = Policy.parse('{"cache": {"semantic": true, "threshold": 0.95}, "allow": ["a*"]}')
    assert policy.cache == CacheRules(semantic=True, threshold=0.95)
    raw = policy.encode()
    assert json.loads(raw)["cache"] == {"semantic": True, "threshold": 0.95}
    assert Policy.parse(raw) == policy and Policy.parse(raw).encode() == raw
    assert hash(Policy.parse(raw)) == hash(policy)  # policies key the /v1/models memo


def test_the_threshold_defaults_to_the_measured_one_and_is_written_down() -> None:
    policy = Policy.parse('{"cache": {"semantic": true}}')
    assert policy.cache == CacheRules(True, DEFAULT_SEMANTIC_THRESHOLD)
    assert json.loads(policy.encode())["cache"]["threshold"] == DEFAULT_SEMANTIC_THRESHOLD


def test_a_policy_without_cache_options_encodes_as_before() -> None:
    policy = Policy(allow=("gpt-4o*",))
    assert policy.cache is None and "cache" not in json.loads(policy.encode())
    assert Policy.parse('{"cache": null}').cache is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"cache": true}', "cache: must be an object"),
        ('{"cache": {"semantic": "yes"}}', "cache.semantic: must be true or false"),
        ('{"cache": {"semantic": 1}}', "cache.semantic: must be true or false"),
        ('{"cache": {"threshold": -0.1}}', "cache.threshold: must be a number from 0.0 to 1.0"),
        ('{"cache": {"threshold": 1.01}}', "cache.threshold: must be a number from 0.0 to 1.0"),
        ('{"cache": {"threshold": true}}', "cache.threshold: must be a number"),
        ('{"cache": {"threshold": "0.95"}}', "cache.threshold: must be a number"),
        ('{"cache": {"semantic": true, "ttl": 5}}', "cache.ttl: unknown field"),
    ],
)
def test_invalid_cache_options_are_refused_naming_the_field(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.")):
        Policy.parse(raw)


@pytest.mark.parametrize("threshold", [0, 0.0, 0.5, 1, 1.0])
def test_any_cosine_from_0_to_1_is_a_threshold(threshold: float) -> None:
    policy = Policy.parse(json.dumps({"cache": {"semantic": True, "threshold": threshold}}))
    assert policy.cache == CacheRules(semantic=True, threshold=float(threshold))


def test_a_threshold_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(ValueError, match=r"cache\.threshold"):
        Policy.parse('{"cache": {"semantic": true, "threshold": NaN}}')
