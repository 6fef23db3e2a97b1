"""`prism smoke --semantic`: a question, then a paraphrase of it, which the origin's
semantic cache must answer (layer ``semantic``) for a project whose policy turns it on."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import httpx

__all__ = ["PARAPHRASE", "QUESTION", "semantic_rows"]

# A paraphrase pair the default threshold takes (cosine ~0.97 with all-MiniLM-L6-v2); the
# random tag keeps it new, so the first is a miss and the second cannot be an exact hit.
QUESTION = "Smoke test {tag}: what is the capital of France?"
PARAPHRASE = "smoke test {tag}: which city is the capital of France"


def semantic_rows(
    client: httpx.Client,
    model: str,
    pause: float,
    row: Callable[[int, httpx.Response, float], dict[str, Any]],
    first_number: int,
) -> list[dict[str, Any]]:
    """Ask the question (a miss), wait ``pause``, ask its paraphrase (semantic)."""
    tag = secrets.token_hex(4)
    rows: list[dict[str, Any]] = []
    for offset, (template, expected) in enumerate(((QUESTION, "miss"), (PARAPHRASE, "semantic"))):
        if offset:
            time.sleep(pause)  # the answer's entry and index record land first
        body = {
            "model": model,
            "messages": [{"role": "user", "content": template.format(tag=tag)}],
            "temperature": 0,
        }
        started = time.perf_counter()
        response = client.post("/v1/chat/completions", json=body)
        done = row(first_number + offset, response, (time.perf_counter() - started) * 1000)
        done["expected"] = [expected]
        done["ok"] = done["status"] == 200 and done["layer"] == expected
        rows.append(done)
        if response.status_code != 200:
            break
    return rows
