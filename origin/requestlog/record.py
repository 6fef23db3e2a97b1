"""One request's record, made once its response has been sent (a stream: after its last
byte), from what the route noted on the request (``origin.http.request.Request``) and the
reply's headers: nothing is looked up again.

The request path pays for one small dict (``RecordMaker.make``) and its JSON, made once for
every sink: the buffers hold that (``Logged``), not the dict. The fields (absent when
unknown) are listed in docs/request-log.md. Never the API key: the route notes the key's
id only, and a refused key's record says ``invalid_api_key``.
Bodies only when the project's policy turns them on (``prism policy set --log-bodies``),
redacted first (``origin.requestlog.redaction``).
"""

from __future__ import annotations

from collections.abc import Mapping
from time import time
from typing import Any, Final

import orjson

from prism import LogRules
from prism import headers as h

from ..http.request import Request
from ..http.responses import Reply
from ..providers.token_counts import Tokens
from .redaction import Redactor

__all__ = ["PROMPT_FIELDS", "Logged", "RecordMaker", "logged"]

# What a request's prompt is, in each API's body: chat, messages; responses, embeddings.
PROMPT_FIELDS = ("system", "messages", "instructions", "input")
_REDACTORS = {False: Redactor(False), True: Redactor(True)}
# The reply's headers a record reads, as this module's own constants: compiled, ``h.NAME``
# is an attribute lookup on the module at every call.
_CACHE_LAYER: Final = h.CACHE_LAYER
_PROVIDER: Final = h.PROVIDER
_SEMANTIC_SCORE: Final = h.SEMANTIC_SCORE
_MAX_ANSWER = 65_536  # characters of an answer's text kept in a record

# A record as the buffers hold it and the sinks take it: its JSON, and what the sinks route
# it by, its time (``ts``), project and request id ("" for none). A tuple of immutables:
# the garbage collector stops tracking it at the first collection it survives, where the
# record's dict (with its stages and attempts) was walked by every collection while a
# buffer held it (the files' buffer holds up to 10,000: a young collection took 3.8 ms).
Logged = tuple[bytes, float, str, str]


class RecordMaker:
    """Makes the records of one origin (its region is the same in each)."""

    __slots__ = ("_region",)

    def __init__(self, region: str | None) -> None:
        self._region = region

    def make(
        self, request: Request, reply: Reply, first_byte: float, ended: float, api: str
    ) -> dict[str, Any]:
        started = request.timer.started
        headers = reply.headers
        status = reply.status
        layer = headers.get(_CACHE_LAYER, "bypass")
        attempts = request.attempts
        error = request.error
        if error:  # an error reply says "bypass"; the record says what happened
            layer = "miss" if attempts else "refused"
        elif request.joined:  # answered by another request's provider call
            layer = "coalesced"
        record: dict[str, Any] = {
            "ts": time(),
            "id": request.id,
            "source": "origin",
            "method": request.method,
            "path": request.path,
            "status": status,
            "layer": layer,
            # A comprehension: dict() of the pairs is 15 % slower compiled.
            "stages": {name: ms for name, ms in request.timer.stages},
            "ttfb_ms": (first_byte - started) * 1000,
            "total_ms": (ended - started) * 1000,
        }
        if api:
            record["api"] = api
        if request.project:
            record["project"] = request.project
        if request.key_id:
            record["key"] = request.key_id
        if self._region is not None:
            record["region"] = self._region
        if error:
            record["error"] = error
        parsed = request.parsed
        if parsed is not None:
            record["model"] = parsed.model
            record["stream"] = parsed.stream
            record["fingerprint"] = request.fingerprint
        charge = request.charge
        if charge is not None:  # a miss: what its provider call used and cost
            served = charge.served
            if served is not None:
                record["provider"], record["answered_model"] = served
            tokens = charge.tokens
            if tokens is not None:
                record["tokens_in"], record["tokens_out"] = tokens.prompt, tokens.completion
            if charge.cost is not None:
                record["cost_usd"] = charge.cost / 1_000_000
            parts = charge.parts
            if parts is not None:  # a resumed stream: who answered, and what each part cost
                record["providers"] = [part[0] for part in parts]
                record["parts"] = [_part(*part) for part in parts]
        elif request.hit_cost is not None:  # a hit: the stored answer's tokens, nothing spent
            saved, tokens = request.hit_cost
            if tokens is not None:
                record["tokens_in"], record["tokens_out"] = tokens.prompt, tokens.completion
            record["cost_usd"] = 0.0
            record["saved_usd"] = saved / 1_000_000
            if layer == "semantic":
                score = headers.get(_SEMANTIC_SCORE)
                if score is not None:
                    record["score"] = float(score)
        if attempts:
            record["attempts"] = attempts  # the flight's own list: its JSON is made now
            if "provider" not in record:  # joined another call: who answered it
                last = attempts[-1]
                if last["status"] == 200:
                    record["provider"], record["answered_model"] = last["provider"], last["model"]
        if "provider" not in record:
            provider = headers.get(_PROVIDER)
            if provider is not None:
                record["provider"] = provider
        rules = request.log_rules
        if rules is not None and rules.bodies and parsed is not None:
            record["body"] = _bodies(parsed.body, reply, rules)
        return record


def logged(record: Mapping[str, Any]) -> Logged:
    """A record made elsewhere (the edge's) as the buffers hold it; one without a time gets
    now."""
    ts = record.get("ts")
    return (
        orjson.dumps(record),
        float(ts) if type(ts) is float or type(ts) is int else time(),
        str(record.get("project") or ""),
        str(record.get("id") or ""),
    )


def _part(provider: str, upstream: str, tokens: Tokens | None, cost: int | None) -> dict[str, Any]:
    part: dict[str, Any] = {"provider": provider, "answered_model": upstream}
    if tokens is not None:
        part["tokens_in"], part["tokens_out"] = tokens.prompt, tokens.completion
    if cost is not None:
        part["cost_usd"] = cost / 1_000_000
    return part


def _bodies(body: Mapping[str, Any], reply: Reply, rules: LogRules) -> dict[str, Any]:
    """The prompt as sent and the answer's text (a whole JSON answer: a stream's text is
    not kept), redacted."""
    redact = _REDACTORS[rules.redact_emails]
    logged: dict[str, Any] = {
        "request": redact.json({name: body[name] for name in PROMPT_FIELDS if name in body})
    }
    if (
        reply.stream is None
        and reply.body
        and reply.headers.get("content-type", "").startswith("application/json")
    ):
        text = _answer_text(reply.body)
        if text is not None:
            logged["response"] = redact.text(text[:_MAX_ANSWER])
    return logged


def _answer_text(raw: bytes) -> str | None:
    """The text of an answer in any of the APIs' forms (chat's choices, Anthropic's content
    blocks, the Responses API's output items); None when it has none (embeddings)."""
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(answer, dict):
        return None
    parts: list[str] = []
    for choice in answer.get("choices") or ():
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            parts.append(message["content"])
    blocks = list(answer.get("content") or ()) if isinstance(answer.get("content"), list) else []
    for item in answer.get("output") or ():
        if isinstance(item, dict) and isinstance(item.get("content"), list):
            blocks += item["content"]
    for block in blocks:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            parts.append(block["text"])
    return "\n".join(parts) if parts else None
