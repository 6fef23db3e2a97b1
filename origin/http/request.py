"""One request as the origin carries it: what arrived, its stage timer, and what the route
learned on the way (its project, parsed body, usage or bill), which the access log and the
trace read once the response has been sent."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from starlette.types import Receive

__all__ = ["Request", "StageTimer"]


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


@dataclass(slots=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    receive: Receive
    id: str
    timer: StageTimer
    # What the route learned, for the access log and the trace (``origin.http.access_log``):
    # set by the handler as it goes, read once the response has been sent.
    project: str = ""
    chat: Any = None  # the parsed request (prism.ChatRequest)
    usage: Any = None  # a hit: the stored answer's usage
    charge: Any = None  # a miss: its bill (origin.governance.billing.Charge), settled when it ends
    error: str = ""  # the error code answered, if any
