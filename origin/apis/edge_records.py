"""``POST /prism/request-log``: the records of the requests the edge answered itself.

A KV hit, a refused key, a denied model: the origin never sees these requests, so each
isolate sends their records in batches after its responses (``edge/request_log.py``),
signed like a forward with the body's SHA-256 in the fingerprint's place. Only the edge
can send them: no API key opens this route, and a batch whose bytes are not the ones
signed is refused. Each record counts in ``prism_edge_requests_total`` (by route, status
and layer), and each KV hit in usage (``requests.kv`` and what it saved, at its model's
price, from its entry's usage), so ``prism usage``, ``prism top`` and the dashboard count
the PoP's answers;
every record then goes to the request log (``on_records``), marked ``"source": "edge"``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import orjson

from prism import (
    AuthenticationError,
    ForwardRejected,
    InvalidRequestError,
    body_digest,
    verify_forward,
)
from prism import headers as h
from prism.routes import (
    CHAT_PATH,
    EMBEDDINGS_PATH,
    MESSAGES_PATH,
    MODELS_PATH,
    REQUEST_LOG_PATH,
    RESPONSES_PATH,
)

from ..governance.billing import Billing
from ..http.asgi import read_body
from ..http.request import Request
from ..http.responses import Reply
from ..metrics import Metrics
from ..providers.token_counts import tokens_of

__all__ = ["MAX_BATCH_BYTES", "EdgeRecords"]

MAX_BATCH_BYTES = 4 << 20  # an isolate's 1,000 queued records, with room
# The origin's route names (its request metric's label), by path.
_ROUTES = {
    CHAT_PATH: "chat",
    EMBEDDINGS_PATH: "embeddings",
    MESSAGES_PATH: "messages",
    RESPONSES_PATH: "responses",
    MODELS_PATH: "models",
}
Records = list[dict[str, Any]]
_SHAPE = "Expected {'fields': [names], 'records': [[values]], 'dropped': n}."


class EdgeRecords:
    """The route's handler: checks the batch, counts its KV hits, hands its records on."""

    def __init__(
        self,
        forward_secret: bytes,
        billing: Billing,
        metrics: Metrics,
        on_records: Callable[[Records], None] | None = None,
    ) -> None:
        self._secret = forward_secret
        self._billing = billing
        self._metrics = metrics
        self._on_records = on_records

    async def __call__(self, request: Request) -> Reply:
        signed = request.headers.get(h.FORWARD)
        if signed is None:
            raise AuthenticationError(
                "This route takes only the edge's signed request records.",
                code="edge_only",
            )
        try:
            forwarded = verify_forward(
                self._secret, signed, method="POST", path=REQUEST_LOG_PATH, now=time.time()
            )
        except ForwardRejected as rejected:
            self._metrics.count_forward_rejected(rejected.reason)
            raise
        body = await read_body(
            request.receive, MAX_BATCH_BYTES, request.headers.get("content-length")
        )
        if body_digest(body) != forwarded.fingerprint:
            self._metrics.count_forward_rejected("body")
            raise ForwardRejected("The records are not the ones signed.", "body")
        records, dropped = _parse(body)
        for record in records:
            record["source"] = "edge"
            route = _ROUTES.get(str(record.get("path")))
            if route is not None:
                record["api"] = route
            self._count(record, route or "edge")
        self._metrics.edge_record_batches.inc()
        self._metrics.edge_records.labels("received").inc(len(records))
        if dropped:
            self._metrics.edge_records.labels("dropped").inc(dropped)
        if self._on_records is not None:
            self._on_records(records)
        return Reply(204, {}, b"")

    def _count(self, record: dict[str, Any], route: str) -> None:
        status, layer = record.get("status"), record.get("layer")
        if not isinstance(status, int) or not isinstance(layer, str):
            return
        stages = record.get("stages")
        seconds = sum(stages.values()) / 1000 if isinstance(stages, dict) else 0.0
        self._metrics.record_edge_request(route, status, layer, seconds)
        project, key_id, model = record.get("project"), record.get("key"), record.get("model")
        if layer != "kv" or status != 200 or not (project and key_id and model):
            return
        usage = record.get("usage")
        tokens = tokens_of(usage if isinstance(usage, dict) else None)
        if tokens is not None:
            record["tokens_in"], record["tokens_out"] = tokens.prompt, tokens.completion
        saved = self._billing.worth(str(model), tokens)  # the entry's tokens, read once
        record["saved_usd"] = saved / 1_000_000
        when = record.get("ts")
        at = float(when) if isinstance(when, int | float) else time.time()
        self._billing.usage.hit(str(project), str(key_id), str(model), saved, at, "kv")


def _parse(body: bytes) -> tuple[Records, int]:
    """The batch's records as dicts (the edge sends rows under a list of field names:
    ``edge/request_log.py``), their stages read from the Server-Timing they carry."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidRequestError("The request records are not JSON.") from None
    if not isinstance(data, dict):
        raise InvalidRequestError(_SHAPE)
    fields, rows = data.get("fields"), data.get("records")
    if not (
        isinstance(fields, list)
        and all(isinstance(f, str) for f in fields)
        and isinstance(rows, list)
        and all(isinstance(r, list) and len(r) == len(fields) for r in rows)
    ):
        raise InvalidRequestError(_SHAPE)
    pop = data.get("pop")
    records = []
    for row in rows:
        record = {name: value for name, value in zip(fields, row, strict=True) if value != ""}
        when = record.pop("ts_ms", None)
        if isinstance(when, int):
            record["ts"] = when / 1000
        timing = record.get("stages")
        record["stages"] = _stages(timing) if isinstance(timing, str) else {}
        if record.get("usage") is None:
            record.pop("usage", None)
        if isinstance(pop, str) and pop:
            record["pop"] = pop
        records.append(record)
    dropped = data.get("dropped", 0)
    return records, dropped if isinstance(dropped, int) and dropped >= 0 else 0


def _stages(timing: str) -> dict[str, float]:
    """``name;dur=ms, ...`` (what ``prism.headers.server_timing`` writes) as a dict."""
    stages: dict[str, float] = {}
    for part in timing.split(","):
        name, _, duration = part.strip().partition(";dur=")
        with contextlib.suppress(ValueError):
            stages[name] = float(duration)
    return stages
