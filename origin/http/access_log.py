"""The access log: one JSON line per request, on the ``prism.access`` logger.

Written after the response has been sent (a stream: after its last bytes), from the
request's record (``origin.requestlog.record``, made once and shared with the request
log's sinks); nothing is looked up again. The line carries the request id, project, model,
cache layer, provider, status, tokens in and out and the cost when known, and the time
to the first byte and in total. Never the API key (the route never notes it) and never
the prompt, unless ``PRISM_ACCESS_LOG_PROMPT`` asks for it.

On with ``PRISM_ACCESS_LOG=on``; the operator routes the logger like any other (``prism
origin serve`` prints it to stdout, one line each). Off (the default: a line costs about a
third of a Redis hit's instructions, docs/architecture.md "Observability") nothing is made.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

import orjson

from ..settings import Settings
from .request import Request

__all__ = ["ACCESS_LOGGER", "AccessLog", "print_access_log"]

ACCESS_LOGGER = "prism.access"
_PROMPT = ("system", "messages", "instructions", "input")  # chat, messages; responses, embeddings
# The record's fields a line carries, and their names in the line.
_FIELDS = (
    ("project", "project"),
    ("model", "model"),
    ("stream", "stream"),
    ("provider", "provider"),
    ("answered_model", "upstream_model"),
    ("tokens_in", "tokens_in"),
    ("tokens_out", "tokens_out"),
    ("cost_usd", "cost_usd"),
    ("error", "error"),
    ("parts", "parts"),  # a resumed stream: each provider's part and its cost
)


class AccessLog:
    """One consumer of the request's record (``origin.requestlog.record``): its line is a
    projection of the record, in the names this log has always used."""

    __slots__ = ("_log", "_prompt")

    def __init__(self, settings: Settings, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger(ACCESS_LOGGER)
        self._prompt = settings.access_log_prompt

    def write(self, record: Mapping[str, Any], request: Request) -> None:
        log = self._log
        if not log.isEnabledFor(logging.INFO):  # nobody listens: build nothing
            return
        line: dict[str, Any] = {
            "ts": round(record["ts"], 3),
            "request_id": record["id"],
            "method": record["method"],
            "path": record["path"],
            "status": record["status"],
            # The reply's layer, as before: an error says "bypass".
            "layer": "bypass" if record.get("error") else record["layer"],
            "ttfb_ms": round(record["ttfb_ms"], 3),
            "total_ms": round(record["total_ms"], 3),
        }
        for name, as_named in _FIELDS:
            value = record.get(name)
            if value is not None:
                line[as_named] = value
        parsed = request.parsed
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


def print_access_log() -> None:
    """``prism origin serve``'s routing: each line as it is, on stdout (the other logs go
    to stderr), whatever the log level."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access = logging.getLogger(ACCESS_LOGGER)
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False
