"""The recent-work memos: they answer only for the exact input, stay bounded, and
never serve an entry past its expiry."""

from __future__ import annotations

from prism import ChatRequest, RecentBodies, RecentEntries, encode_envelope, parse_chat_request

BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


def test_bodies_are_per_project_and_exact() -> None:
    recent: RecentBodies[ChatRequest] = RecentBodies(size=2)
    chat = parse_chat_request(BODY)
    recent.put("acme", BODY, chat, "fp1")
    assert recent.get("acme", BODY) == (chat, "fp1")
    assert recent.get("other", BODY) is None
    assert recent.get("acme", BODY + b" ") is None


def test_bodies_stay_bounded_and_skip_large_ones() -> None:
    recent: RecentBodies[ChatRequest] = RecentBodies(size=2)
    chat = parse_chat_request(BODY)
    for i in range(5):
        recent.put("acme", BODY + b" " * i, chat, f"fp{i}")
    assert sum(recent.get("acme", BODY + b" " * i) is not None for i in range(5)) <= 2
    large = BODY + b" " * RecentBodies.MAX_BODY
    recent.put("acme", large, chat, "big")
    assert recent.get("acme", large) is None


def test_entries_are_decoded_once_and_expire_on_time() -> None:
    raw = encode_envelope(b'{"id":"x"}', model="m", ttl=60, created=1000)
    recent = RecentEntries()
    first = recent.decode(raw, now=1001)
    assert first is not None and first.body == b'{"id":"x"}'
    assert recent.decode(raw, now=1059) is first  # remembered
    assert recent.decode(raw, now=1060) is None  # expired, memo or not
    assert recent.decode(raw.decode(), now=1001) is not None  # str from KV as well


def test_entries_reject_what_decode_rejects() -> None:
    recent = RecentEntries()
    raw = encode_envelope(b'{"id":"x"}', model="m", ttl=60, created=1000)
    assert recent.decode(raw[:-1], now=1001) is None  # truncated
    assert recent.decode(b"garbage", now=1001) is None
    assert recent.decode(raw, now=2000) is None  # expired on first sight: not kept
    assert recent.decode(raw, now=1001) is not None


def test_size_limits_count_what_a_str_can_take_in_memory() -> None:
    recent: RecentBodies[ChatRequest] = RecentBodies()
    chat = parse_chat_request(BODY)
    wide = "é" + "x" * (RecentBodies.MAX_BODY // 2)  # half the limit in chars, ~2x it in memory
    recent.put("acme", wide, chat, "fp")
    assert recent.get("acme", wide) is None
    narrow = "x" * (RecentBodies.MAX_BODY // 2)
    recent.put("acme", narrow, chat, "fp")
    assert recent.get("acme", narrow) == (chat, "fp")
