"""One request as the origin carries it: what arrived, its stage timer, and what the route
learned on the way (its project, key, parsed body, usage or bill, provider attempts), which
the request log, the access log and the trace read once the response has been sent."""

from __future__ import annotations

import time
from typing import Any, Protocol

from starlette.types import Receive

from prism import LogRules
from prism.parsers import ParsedRequest

from ..providers.token_counts import Tokens

__all__ = ["Bill", "BilledPart", "Request", "StageTimer"]


class StageTimer:
    """Milliseconds per named stage, for Server-Timing, and when the request arrived."""

    __slots__ = ("_last", "stages", "started")

    def __init__(self) -> None:
        self.started = self._last = time.perf_counter()
        self.stages: list[tuple[str, float]] = []

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages.append((stage, (now - self._last) * 1000))
        self._last = now


class Bill(Protocol):
    """What the access log and the trace read of a miss's bill once its call has ended
    (``origin.governance.billing.Charge``)."""

    @property
    def tokens(self) -> Tokens | None: ...  # None: the provider reported no usage
    @property
    def cost(self) -> int | None: ...  # micro-dollars; None: no price for what answered
    @property
    def served(self) -> tuple[str, str] | None: ...  # (provider, upstream model)
    @property
    def parts(self) -> tuple[BilledPart, ...] | None: ...  # a resumed stream's, in order


# (provider, upstream model, tokens, micro-dollars) of one provider's part of an answer.
BilledPart = tuple[str, str, Tokens | None, int | None]


class Request:
    """What arrived, then what the route learned, for the access log and the trace
    (``origin.http.access_log``), set by the handler as it goes and read once the response
    has been sent. A plain class, not a dataclass: compiled, its ``__init__`` is native
    code, where a dataclass's is generated Python, run on every request."""

    __slots__ = (
        "attempts",
        "charge",
        "error",
        "fingerprint",
        "headers",
        "hit_cost",
        "id",
        "joined",
        "key_id",
        "log_rules",
        "method",
        "parsed",
        "path",
        "project",
        "query",
        "receive",
        "timer",
        "usage",
    )

    def __init__(
        self,
        method: str,
        path: str,
        headers: dict[str, str],  # lower-case names
        receive: Receive,
        id: str,
        timer: StageTimer,
    ) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.receive = receive
        self.id = id
        self.timer = timer
        self.project = ""
        self.parsed: ParsedRequest | None = None  # the API's parsed body (a chat request, ...)
        self.usage: dict[str, Any] | None = None  # a hit: the stored answer's usage
        self.charge: Bill | None = None  # a miss: its bill, settled when its call ends
        self.error = ""  # the error code answered, if any
        # For the request log (``origin.requestlog.record``): the caller's key id (never the
        # key), the request's fingerprint, the provider attempts of the call it started or
        # joined (filled as the call goes), whether it joined another request's call, and
        # the project's log options when they put bodies in the record.
        self.key_id = ""
        self.fingerprint = ""
        self.attempts: list[dict[str, Any]] | None = None
        self.joined = False
        # A hit: what its stored answer would have cost (micro-dollars) and its tokens.
        self.hit_cost: tuple[int, Tokens | None] | None = None
        self.log_rules: LogRules | None = None
        self.query = b""  # the raw query string, on a ``Routes(reads_query=True)`` (the admin's)
