import json
from typing import Any

from prism import MIN_TTL, CachePolicy, classify, parse_chat_request


def request(**fields: Any):  # type: ignore[no-untyped-def]
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    return parse_chat_request(json.dumps(body).encode())


def test_stream_and_sampling_are_cacheable_by_default() -> None:
    decision = classify(request(stream=True, temperature=0.9, n=3))
    assert decision.read and decision.write and decision.ttl == CachePolicy().default_ttl


def test_cache_control_directives() -> None:
    assert not classify(request(), "no-cache").read
    assert classify(request(), "no-cache").write
    assert not classify(request(), "no-store").write
    assert classify(request(), "no-store").read
    assert classify(request(), "no-cache, no-store").bypass
    assert classify(request(), "max-age=3600").ttl == 3600
    assert classify(request(), "max-age=5").ttl == MIN_TTL
    assert classify(request(), 'Max-Age="120"').ttl == 120
    assert classify(request(), "max-age=99999999999").ttl == CachePolicy().max_ttl
    assert classify(request(), "max-age=banana").ttl == CachePolicy().default_ttl


def test_project_can_refuse_sampled_answers() -> None:
    strict = CachePolicy(cache_sampled=False)
    assert classify(request(temperature=0.7), policy=strict).bypass
    assert not classify(request(temperature=0), policy=strict).bypass
    assert not classify(request(temperature=0.7, seed=1), policy=strict).bypass
    assert classify(request(), policy=CachePolicy(enabled=False)).bypass
