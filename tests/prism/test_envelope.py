import json

from hypothesis import given
from hypothesis import strategies as st

from prism import decode_envelope, encode_envelope

BODY = json.dumps({"id": "x", "object": "chat.completion", "choices": []}).encode()


def test_round_trip_serves_the_exact_bytes() -> None:
    data = encode_envelope(BODY, model="m", ttl=60, usage={"total_tokens": 3}, created=1000)
    envelope = decode_envelope(data, now=1001)
    assert envelope is not None
    assert envelope.body == BODY and envelope.model == "m" and envelope.usage == {"total_tokens": 3}
    assert decode_envelope(data.decode(), now=1001) == envelope
    assert envelope.completion()["id"] == "x"


def test_expired_entry_is_a_miss() -> None:
    data = encode_envelope(BODY, model="m", ttl=60, created=1000)
    assert decode_envelope(data, now=1059) is not None
    assert decode_envelope(data, now=1060) is None


def test_truncated_corrupted_or_foreign_entries_are_misses() -> None:
    data = encode_envelope(BODY, model="m", ttl=60, created=1000)
    assert decode_envelope(data[:-1], now=1000) is None
    assert decode_envelope(data.replace(b'"x"', b'"y"'), now=1000) is None
    assert decode_envelope(data.replace(b'"v":1', b'"v":2'), now=1000) is None
    assert decode_envelope(None) is None
    assert decode_envelope(b"") is None


@given(st.binary(max_size=300) | st.text(max_size=300))
def test_garbage_never_raises(garbage: bytes | str) -> None:
    assert decode_envelope(garbage) is None


def test_a_fallbacks_answer_says_so_and_any_other_entry_is_unchanged() -> None:
    plain = encode_envelope(BODY, model="m", ttl=60, created=1000)
    marked = encode_envelope(BODY, model="m", ttl=60, created=1000, fallback=True)
    assert b"fallback" not in plain  # entries written before the flag read the same
    decoded, flagged = decode_envelope(plain, now=1000), decode_envelope(marked, now=1000)
    assert decoded is not None and not decoded.fallback
    assert flagged is not None and flagged.fallback and flagged.body == BODY
