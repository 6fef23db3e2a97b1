"""One request's record, made once its response has been sent (a stream: after its last
byte), from what the route noted on the request (``origin.http.request.Request``) and the
reply's headers: nothing is looked up again.

The request path pays for one small dict (``RecordMaker.make``); what can wait (the stages
as a mapping) is done by ``finish`` in the flush task, before a sink sees it. The
fields (absent when unknown) are listed in docs/request-log.md. Never the API key: the
route notes the key's id only, and a refused key's record says ``invalid_api_key``.
Bodies only when the project's policy turns them on (``prism policy set --log-bodies``),
redacted first (``origin.requestlog.redaction``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from prism import LogRules
from prism import headers as h

from ..http.request import Request
from ..http.responses import Reply
from ..providers.token_counts import Tokens
from .redaction import Redactor

__all__ = ["ENCODED", "PROMPT_FIELDS", "RecordMaker", "encoded", "finish", "keep_encoded"]

# What a request's prompt is, in each API's body: chat, messages; responses, embeddings.
PROMPT_FIELDS = ("system", "messages", "instructions", "input")
_REDACTORS = {False: Redactor(False), True: Redactor(True)}
_MAX_ANSWER = 65_536  # characters of an answer's text kept in a record
# A finished record's JSON, kept in it by its buffer (``keep_encoded``) for every sink: the
# window and the files made the same bytes twice, a microsecond or more a record each. Not
# a field: made after the JSON, and skipped by any sink reading fields.
ENCODED = "_json"


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
        layer = headers.get(h.CACHE_LAYER, "bypass")
        attempts = request.attempts
        error = request.error
        if error:  # an error reply says "bypass"; the record says what happened
            layer = "miss" if attempts else "refused"
        elif request.joined:  # answered by another request's provider call
            layer = "coalesced"
        record: dict[str, Any] = {
            "ts": time.time(),
            "id": request.id,
            "source": "origin",
            "method": request.method,
            "path": request.path,
            "status": status,
            "layer": layer,
            "stages": request.timer.stages,  # (name, ms) pairs until ``finish``
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
                score = headers.get(h.SEMANTIC_SCORE)
                if score is not None:
                    record["score"] = float(score)
        if attempts:
            record["attempts"] = attempts
            if "provider" not in record:  # joined another call: who answered it
                last = attempts[-1]
                if last["status"] == 200:
                    record["provider"], record["answered_model"] = last["provider"], last["model"]
        if "provider" not in record:
            provider = headers.get(h.PROVIDER)
            if provider is not None:
                record["provider"] = provider
        rules = request.log_rules
        if rules is not None and rules.bodies and parsed is not None:
            record["body"] = _bodies(parsed.body, reply, rules)
        return record


def finish(record: dict[str, Any]) -> dict[str, Any]:
    """What the request path left for later: the stages as a mapping, and a copy of the
    attempts (the flight's own list). Idempotent: each sink's buffer may finish the same
    record. Times keep their full precision: rounding them cost more than the rest of the
    record (``round(x, 3)`` is a microsecond a call)."""
    stages = record["stages"]
    if type(stages) is list:
        record["stages"] = dict(stages)
        attempts = record.get("attempts")
        if attempts is not None:
            record["attempts"] = list(attempts)
    return record


def keep_encoded(record: dict[str, Any]) -> dict[str, Any]:
    """The finished record with its JSON kept in it (``ENCODED``), for every sink to share;
    its buffer does this once the record is finished. Idempotent."""
    if ENCODED not in record:
        record[ENCODED] = orjson.dumps(record)
    return record


def encoded(record: Mapping[str, Any]) -> bytes:
    """The record as JSON (without ``ENCODED``): the kept bytes when its buffer kept them."""
    line = record.get(ENCODED)
    return orjson.dumps(record) if line is None else line


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
