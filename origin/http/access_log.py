"""The access log: one JSON line per request, on the ``prism.access`` logger.

Written after the response has been sent (a stream: after its last bytes), from what
the route noted on the request as it went (``origin.http.asgi.Request``) and the reply's
headers; nothing is looked up again. The line carries the request id, project, model,
cache layer, provider, status, tokens in and out and the cost when known (a resumed
stream's also each provider's part: ``parts``), and the time to the first byte and in
total. Never the API key (the route never notes it) and never the prompt, unless
``PRISM_ACCESS_LOG_PROMPT`` asks for it.

On with ``PRISM_ACCESS_LOG=on``; the operator routes the logger like any other (``prism
origin serve`` prints it to stdout, one line each). Off (the default: a line costs about a
third of a Redis hit's instructions, docs/architecture.md "Observability") nothing is made.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from prism import headers as h

from ..providers.token_counts import Tokens, tokens_of
from ..settings import Settings
from .request import Request
from .responses import Reply

__all__ = ["ACCESS_LOGGER", "AccessLog", "print_access_log"]

ACCESS_LOGGER = "prism.access"
_PROMPT = ("system", "messages", "instructions", "input")  # chat, messages; responses, embeddings


class AccessLog:
    __slots__ = ("_log", "_prompt")

    def __init__(self, settings: Settings, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger(ACCESS_LOGGER)
        self._prompt = settings.access_log_prompt

    def write(self, request: Request, reply: Reply, first_byte: float, ended: float) -> None:
        log = self._log
        if not log.isEnabledFor(logging.INFO):  # nobody listens: build nothing
            return
        started = request.timer.started
        headers = reply.headers
        line: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "request_id": request.id,
            "method": request.method,
            "path": request.path,
            "status": reply.status,
            "layer": headers.get(h.CACHE_LAYER, "bypass"),
            "ttfb_ms": round((first_byte - started) * 1000, 3),
            "total_ms": round((ended - started) * 1000, 3),
        }
        if request.project:
            line["project"] = request.project
        parsed = request.parsed
        if parsed is not None:
            line["model"] = parsed.model
            line["stream"] = parsed.stream
        charge = request.charge
        if charge is not None:  # a miss: what its provider call used and cost
            served = charge.served
            if served is not None:
                line["provider"], line["upstream_model"] = served
            tokens = charge.tokens
            if tokens is not None:
                line["tokens_in"], line["tokens_out"] = tokens.prompt, tokens.completion
            if charge.cost is not None:
                line["cost_usd"] = charge.cost / 1_000_000
            parts = charge.parts
            if parts is not None:  # a resumed stream: what each provider's part cost
                line["parts"] = [_part(*part) for part in parts]
        elif request.usage is not None:  # a hit: the stored answer's tokens, nothing spent
            tokens = tokens_of(request.usage)  # read as the bill and a miss's line read them
            if tokens is not None:
                line["tokens_in"], line["tokens_out"] = tokens.prompt, tokens.completion
            line["cost_usd"] = 0
        if "provider" not in line:
            provider = headers.get(h.PROVIDER)
            if provider is not None:
                line["provider"] = provider
        if request.error:
            line["error"] = request.error
        if self._prompt and parsed is not None:  # asked for: what was asked, as sent
            body = parsed.body
            line["prompt"] = {name: body[name] for name in _PROMPT if name in body}
        # The record made directly: ``log.info`` would also walk the stack for the caller's
        # file and line, which say nothing here and cost more than the line itself.
        log.handle(
            log.makeRecord(
                log.name, logging.INFO, __file__, 0, orjson.dumps(line).decode(), (), None
            )
        )


def _part(provider: str, upstream: str, tokens: Tokens | None, cost: int | None) -> dict[str, Any]:
    part: dict[str, Any] = {"provider": provider, "upstream_model": upstream}
    if tokens is not None:
        part["tokens_in"], part["tokens_out"] = tokens.prompt, tokens.completion
    if cost is not None:
        part["cost_usd"] = cost / 1_000_000
    return part


def print_access_log() -> None:
    """``prism origin serve``'s routing: each line as it is, on stdout (the other logs go
    to stderr), whatever the log level."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access = logging.getLogger(ACCESS_LOGGER)
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False
