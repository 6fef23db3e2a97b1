"""A test-only Worker: runs the shared vectors through `prism` inside the Workers runtime."""

import json
from typing import Any

from js import Response

from prism import KeyRing, PrismError, fingerprint, parse_chat_request
from prism.parsers import parse_for_path


async def on_fetch(request: Any, env: Any, ctx: Any) -> Any:  # JS objects, as edge.workers
    if request.method != "POST":
        return Response.new("send the vectors file as the body")
    vectors = json.loads(await request.text())
    ring = KeyRing({int(v): s.encode() for v, s in vectors["key_secrets"].items()})
    keys = []
    for vector in vectors["keys"]:
        try:
            keys.append(
                {"key": vector["key"], "valid": True, "project": ring.verify(vector["key"]).project}
            )
        except PrismError as error:
            keys.append({"key": vector["key"], "valid": False, "code": error.code})
    prints = [
        fingerprint(v["project"], v["path"], parse_chat_request(v["body"].encode()))
        for v in vectors["fingerprints"]
    ]
    api_prints = [
        fingerprint(v["project"], v["path"], parse_for_path(v["path"], v["body"].encode()))
        for v in vectors["api_fingerprints"]
    ]
    return Response.new(
        json.dumps({"keys": keys, "fingerprints": prints, "api_fingerprints": api_prints})
    )
