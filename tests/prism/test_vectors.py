"""The shared vectors: the edge tests run the same file inside the Worker runtime."""

import json
from pathlib import Path

from prism import KeyRing, PrismError, fingerprint, parse_chat_request
from prism.parsers import parse_for_path

VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "core.json").read_text())


def test_fingerprints_match_the_vectors() -> None:
    for vector in VECTORS["fingerprints"]:
        request = parse_chat_request(vector["body"].encode())
        assert fingerprint(vector["project"], vector["path"], request) == vector["fingerprint"]


def test_other_apis_fingerprints_match_the_vectors() -> None:
    for vector in VECTORS["api_fingerprints"]:
        request = parse_for_path(vector["path"], vector["body"].encode())
        assert fingerprint(vector["project"], vector["path"], request) == vector["fingerprint"]
    acme = [v["fingerprint"] for v in VECTORS["api_fingerprints"] if v["project"] == "acme"]
    assert acme[0] == acme[1]  # embeddings: key order and user do not count
    assert acme[4] == acme[5]  # messages: key order, stream and metadata do not count
    assert acme[7] == acme[8]  # responses: key order, stream, store, metadata, user neither
    assert len(set(acme)) == len(acme) - 3
    chat = {v["fingerprint"] for v in VECTORS["fingerprints"]}
    assert chat.isdisjoint(acme)


def test_key_verdicts_match_the_vectors() -> None:
    ring = KeyRing({int(v): s.encode() for v, s in VECTORS["key_secrets"].items()})
    for vector in VECTORS["keys"]:
        try:
            verdict = {
                "key": vector["key"],
                "valid": True,
                "project": ring.verify(vector["key"]).project,
            }
        except PrismError as error:
            verdict = {"key": vector["key"], "valid": False, "code": error.code}
        assert verdict == vector


def test_vectors_cover_equal_and_distinct_cases() -> None:
    acme = [v["fingerprint"] for v in VECTORS["fingerprints"] if v["project"] == "acme"]
    assert acme[0] == acme[1]  # key order, stream and user do not count
    assert acme[2] == acme[3] == acme[4]  # 0, 0.0, 0e0
    assert acme[6] == acme[7]  # unicode escapes
    assert len(set(acme)) == len(acme) - 4
    assert {v["valid"] for v in VECTORS["keys"]} == {True, False}
