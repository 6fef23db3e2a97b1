"""One provider call shared by every identical request in flight (request coalescing).

A ``Flight`` runs the upstream call in its own task and records what arrives:
stream events as they come, then the final completion or the error. Each
client is a subscriber reading at its own pace, so 50 identical misses make
one provider call, a client that goes away does not break the others, and the
call is cancelled only when its last streaming subscriber has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from prism import PrismError, SSEDecoder, StreamAssembler, UpstreamError, error_json

from .providers.base import UpstreamCompletion
from .router import Router

__all__ = ["Flight", "FlightTable"]

log = logging.getLogger("prism.origin")

# Called with a complete answer and whether a fallback target gave it.
OnComplete = Callable[[UpstreamCompletion, bool], None]


class Flight:
    def __init__(self) -> None:
        self.events: list[bytes] = []  # chunk JSON payloads, in order
        self.usage_only: list[bool] = []  # the trailing usage chunk, for clients that did not ask
        self.result: UpstreamCompletion | None = None
        self.error: PrismError | None = None
        self.provider = ""  # what x-prism-provider says
        self.fallback = False
        self.done = False
        self.subscribers = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- the producer side -------------------------------------------------------------

    def start(self, work: Awaitable[None]) -> None:
        self._task = asyncio.ensure_future(work)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def publish(self, data: bytes, usage_only: bool) -> None:
        self.events.append(data)
        self.usage_only.append(usage_only)

    def flush(self) -> None:
        self._notify()

    def finish(self, result: UpstreamCompletion | None, error: PrismError | None = None) -> None:
        self.result, self.error, self.done = result, error, True
        self._notify()

    # -- the consumer side -------------------------------------------------------------
    #
    # Every client joins while it needs the flight and leaves when done or gone; the
    # upstream call is cancelled only when the last one has left before it finished.

    def join(self) -> None:
        self.subscribers += 1

    def leave(self) -> None:
        self.subscribers -= 1
        if self.subscribers == 0 and not self.done and self._task is not None:
            # The last reader left mid-stream: stop paying for tokens nobody reads.
            self._task.cancel()

    async def wait_started(self) -> None:
        """Until the first event arrived or the flight ended (call between join and leave)."""
        while not self.events and not self.done:
            await self._changed.wait()

    async def wait_done(self) -> None:
        self.join()
        try:
            while not self.done:
                await self._changed.wait()
        finally:
            self.leave()

    async def follow(self, include_usage: bool) -> AsyncIterator[bytes]:
        """SSE bytes for one joined client: live events, then ``[DONE]`` or an error event."""
        seen = 0
        while True:
            if seen < len(self.events):
                end = len(self.events)
                out = [
                    b"data: " + self.events[i] + b"\n\n"
                    for i in range(seen, end)
                    if include_usage or not self.usage_only[i]
                ]
                seen = end
                if out:
                    yield b"".join(out)
                continue
            if self.done:
                break
            await self._changed.wait()
        if self.error is not None:
            yield b"data: " + error_json(self.error) + b"\n\n"
        else:
            yield b"data: [DONE]\n\n"


class FlightTable:
    """Runs provider calls as flights and joins identical concurrent requests to them."""

    def __init__(self, router: Router, on_join: Callable[[], None] | None = None) -> None:
        self._router = router
        self._flights: dict[str, Flight] = {}
        self._on_join = on_join

    def get_or_start(
        self,
        key: str | None,
        body: dict[str, Any],
        model: str,
        stream: bool,
        on_complete: OnComplete | None,
    ) -> Flight:
        """The flight for ``key`` (joined) or a new one; ``key=None`` never joins."""
        if key is not None:
            flight = self._flights.get(key)
            if flight is not None and not flight.done:
                if self._on_join:
                    self._on_join()
                return flight
        flight = Flight()
        work = self._stream(flight, body, model) if stream else self._complete(flight, body, model)
        flight.start(self._run(flight, key, work, on_complete))
        if key is not None:
            self._flights[key] = flight
        return flight

    async def _run(
        self, flight: Flight, key: str | None, work: Awaitable[None], on_complete: OnComplete | None
    ) -> None:
        try:
            await work
        except PrismError as error:
            flight.finish(None, error)
        except asyncio.CancelledError:
            flight.finish(None, UpstreamError("The request was cancelled.", code="cancelled"))
            raise
        except Exception:
            # A bug must still end every waiter, or they would wait for ever.
            log.exception("provider call failed unexpectedly")
            flight.finish(None, PrismError("The gateway failed unexpectedly."))
        finally:
            if key is not None and self._flights.get(key) is flight:
                del self._flights[key]
        if flight.result is not None and on_complete is not None:
            on_complete(flight.result, flight.fallback)

    async def _complete(self, flight: Flight, body: dict[str, Any], model: str) -> None:
        routed = await self._router.complete(body, model)
        flight.provider, flight.fallback = routed.label, routed.fallback
        flight.finish(routed.value)

    async def _stream(self, flight: Flight, body: dict[str, Any], model: str) -> None:
        routed = await self._router.stream(body, model)
        upstream = routed.value
        flight.provider, flight.fallback = routed.label, routed.fallback
        decoder, assembler = SSEDecoder(), StreamAssembler()
        try:
            async for raw in upstream.events:
                for data in decoder.feed(raw):
                    if data == b"[DONE]":
                        assembler.finish()
                        continue
                    try:
                        chunk = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        raise UpstreamError(
                            f"Provider '{flight.provider}' sent a malformed stream event.",
                            code="upstream_malformed",
                        ) from None
                    if not isinstance(chunk, dict) or chunk.get("error"):
                        raise UpstreamError(
                            f"Provider '{flight.provider}' reported an error mid-stream.",
                            code="upstream_stream_error",
                        )
                    assembler.add(chunk)
                    flight.publish(data, not chunk.get("choices") and "usage" in chunk)
                flight.flush()
        finally:
            with contextlib.suppress(Exception):
                await upstream.aclose()
        if not assembler.complete:
            raise UpstreamError(
                f"Provider '{flight.provider}' ended the stream early.", code="upstream_truncated"
            )
        completion = assembler.completion()
        flight.finish(UpstreamCompletion(body=orjson.dumps(completion), completion=completion))
