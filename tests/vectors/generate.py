"""Regenerate core.json: `python -m tests.vectors.generate`.

Only do this for a deliberate format change: a changed fingerprint colds every cache.
"""

from __future__ import annotations

import json
from pathlib import Path

from prism import KeyRing, fingerprint, parse_chat_request
from prism.parsers import parse_for_path

HERE = Path(__file__).parent
PATH = "/v1/chat/completions"
SECRETS = {"1": "vector-secret-one-0123456789", "2": "vector-secret-two-9876543210"}

BODIES = [
    '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}]}',
    '{"messages":[{"content":"Hello","role":"user"}],"model":"gpt-4o-mini","stream":true,"user":"u1"}',
    '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}],"temperature":0}',
    '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}],"temperature":0.0}',
    '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}],"temperature":0e0}',
    '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}],"temperature":0.7,"top_p":0.95}',
    '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"caf\\u00e9 \\ud83c\\udf0d"}]}',
    '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"café 🌍"}]}',
    '{"model":"claude-3-5-haiku","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_tokens":64,"stop":["\\n"],"seed":7}',
    '{"model":"gpt-4o","messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"tool_choice":"required","n":2,"logit_bias":{"50256":-100},"response_format":{"type":"json_object"},"reasoning_effort":"low"}',
    '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"big"}],"max_tokens":1e3,"presence_penalty":-1.5,"frequency_penalty":1.25e0}',
]
PROJECTS = ["acme", "globex-2"]
# The other cached APIs: (path, body). Pairs that must agree sit side by side.
API_BODIES = [
    ("/v1/embeddings", '{"model":"text-embedding-3-small","input":"Hello"}'),
    ("/v1/embeddings", '{"input":"Hello","user":"u1","model":"text-embedding-3-small"}'),
    (
        "/v1/embeddings",
        '{"model":"text-embedding-3-small","input":["Hello","caf\\u00e9"],"encoding_format":"base64","dimensions":256}',
    ),
    ("/v1/embeddings", '{"model":"text-embedding-3-small","input":[[1,2,3],[4]]}'),
    (
        "/v1/messages",
        '{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Hello"}]}',
    ),
    (
        "/v1/messages",
        '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":64,"model":"claude-sonnet-4-5","stream":true,"metadata":{"user_id":"u1"}}',
    ),
    (
        "/v1/messages",
        '{"model":"claude-sonnet-4-5","max_tokens":64,"system":"Be brief.","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}],"temperature":0.0,"tools":[{"name":"f","input_schema":{"type":"object"}}]}',
    ),
    ("/v1/responses", '{"model":"gpt-4o-mini","input":"Hello"}'),
    (
        "/v1/responses",
        '{"input":"Hello","store":false,"metadata":{"k":"v"},"model":"gpt-4o-mini","stream":true,"user":"u1"}',
    ),
    (
        "/v1/responses",
        '{"model":"gpt-4o","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"caf\\u00e9"}]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"ok"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"},"strict":true}],"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}},"temperature":0.0,"max_output_tokens":1e2}',
    ),
]


def generate() -> dict[str, object]:
    ring = KeyRing({int(v): s.encode() for v, s in SECRETS.items()})
    good_v1 = ring.mint("acme", key_id="a1b2c3d4e5f60718", version=1)
    good_v2 = ring.mint("globex-2", key_id="0f1e2d3c4b5a6978", version=2)
    other = KeyRing({1: b"some-other-secret-0123456"}).mint("acme", key_id="a1b2c3d4e5f60718")
    keys = [
        good_v1,
        good_v2,
        good_v1[:-1] + ("A" if good_v1[-1] != "A" else "B"),
        good_v1.replace(".acme.", ".globex-2."),
        other,
        good_v1.replace("sk-prism-v1.", "sk-prism-v3."),
        "sk-live-not-ours",
        "",
        good_v2 + "x",
        # One spelling: digits are ASCII digits (str.isdigit() and int() take these too).
        good_v1.replace("sk-prism-v1.", "sk-prism-v\u00b9."),  # superscript one
        good_v1.replace("sk-prism-v1.", "sk-prism-v\u0661."),  # Arabic-Indic one
        good_v1.replace("sk-prism-v1.", "sk-prism-v\uff11."),  # fullwidth one
        good_v1.replace("a1b2c3d4", "a\u0661b2c3d"),  # a non-ASCII digit in the key id
    ]
    key_vectors = []
    for key in keys:
        try:
            identity = ring.verify(key)
            key_vectors.append({"key": key, "valid": True, "project": identity.project})
        except Exception as error:
            key_vectors.append({"key": key, "valid": False, "code": getattr(error, "code", "")})
    fingerprints = [
        {
            "project": project,
            "path": PATH,
            "body": body,
            "fingerprint": fingerprint(project, PATH, parse_chat_request(body.encode())),
        }
        for body in BODIES
        for project in PROJECTS
    ]
    api_fingerprints = [
        {
            "project": project,
            "path": path,
            "body": body,
            "fingerprint": fingerprint(project, path, parse_for_path(path, body.encode())),
        }
        for path, body in API_BODIES
        for project in PROJECTS
    ]
    return {
        "key_secrets": SECRETS,
        "keys": key_vectors,
        "fingerprints": fingerprints,
        "api_fingerprints": api_fingerprints,
    }


if __name__ == "__main__":
    (HERE / "core.json").write_text(json.dumps(generate(), indent=1, ensure_ascii=False) + "\n")
