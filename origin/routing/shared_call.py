"""One provider call shared by every identical request in flight: what it asks
(``Call``), where its answer is stored (``Storage``), and the ``Flight`` that runs it in
its own task, recording what arrives (stream events as they come, then the answer or
the error) for its subscribers (``origin.routing.subscription``) to read at their own
pace. ``origin.routing.coalescing`` is where identical requests find it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn, Protocol

from prism import PrismError, SSEDecoder, UpstreamError

from ..providers.base import UpstreamCompletion, UpstreamStream
from .operation import Operation, StreamBuilder
from .router import Routed

__all__ = ["Call", "Flight", "FlightRouter", "Storage"]

_DRAIN_SECONDS = 1.0  # after [DONE]: how long the rest of a body may take to end
log = logging.getLogger("prism.origin")


class FlightRouter(Protocol):
    """What a flight calls on the router: ``origin.routing.router.Router`` (or a stand-in)."""

    async def complete(
        self, body: dict[str, Any], model: str, op: Operation
    ) -> Routed[UpstreamCompletion]: ...

    async def stream(
        self, body: dict[str, Any], model: str, op: Operation
    ) -> Routed[UpstreamStream]: ...

    def stream_failed(self, routed: Routed[UpstreamStream], error: PrismError) -> None: ...

    def stream_finished(self, routed: Routed[UpstreamStream]) -> None: ...

    def redact(self, routed: Routed[Any], message: str) -> str: ...


class Storage(NamedTuple):
    """Where a complete answer is cached."""

    fingerprint: str
    ttl: int  # seconds, before the fallback cap
    semantic: Any = None  # the question to index once stored (origin.store.semantic.Pending)


class Call(NamedTuple):  # a tuple: made on every miss, and cheaper than a frozen dataclass
    """What the flight asks the provider, and what it does with the answer."""

    op: Operation  # the API's call (chat completions, embeddings, messages)
    body: dict[str, Any]
    model: str
    stream: bool
    request_id: str  # of the request that started the flight: its log lines name it
    storage: Storage | None = None  # None: the answer is not cached
    # Told once when the call ends: (answer or None, provider, upstream model). The
    # request that started the flight pays for it (``origin/governance/billing.py``).
    on_end: Callable[[UpstreamCompletion | None, str, str], None] | None = None


class Flight:
    """One shared provider call. Its state is read by its subscriptions
    (``origin.routing.subscription``) and written only by the flight's own task."""

    __slots__ = (
        "_key",
        "_on_abandon",
        "_on_end",
        "_router",
        "_subscribers",
        "_task",
        "call",
        "error",
        "fallback",
        "frames",
        "provider",
        "result",
        "served_by",
        "usage_frames",
        "waiters",
    )

    def __init__(
        self,
        key: str | None,
        call: Call,
        router: FlightRouter,
        on_end: Callable[[Flight], None],
        on_abandon: Callable[[Flight], None],
    ) -> None:
        self._key = key
        self.call = call
        self._router = router
        self._on_end = on_end
        self._on_abandon = on_abandon
        self.frames: list[bytes] = []  # the SSE frames so far, ``data: {chunk}\n\n``
        self.usage_frames: set[int] = set()  # the trailing usage chunk: only if asked for
        self.result: UpstreamCompletion | None = None
        self.error: PrismError | None = None
        self.provider = ""  # what x-prism-provider says
        self.fallback = False
        self.served_by = ("", "")  # (provider, upstream model) that answered
        self._subscribers = 0
        self.waiters: list[asyncio.Future[None]] = []  # one per client waiting for a change
        self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def key(self) -> str | None:
        return self._key

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def started(self) -> bool:
        return bool(self.frames) or self.done

    def _notify(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():  # a waiter cancelled with its client is done already
                waiter.set_result(None)

    async def next_change(self) -> None:
        """Until the flight publishes something."""
        waiter = self._task.get_loop().create_future()
        self.waiters.append(waiter)
        await waiter

    # -- membership ------------------------------------------------------------------

    def join(self) -> None:
        self._subscribers += 1

    def leave(self) -> None:
        self._subscribers -= 1
        if self._subscribers == 0 and not self.done:
            # Nobody waits for this answer any more: stop paying for it. Forgotten first,
            # so an identical request arriving now starts afresh instead of joining a
            # call about to be cancelled.
            self._on_abandon(self)
            self._task.cancel()

    # -- the provider call (the flight's own task) -------------------------------------

    async def _run(self) -> None:
        call = self.call
        try:
            if call.stream:
                await self._stream(call)
            else:
                routed = await self._router.complete(call.body, call.model, call.op)
                self.provider, self.fallback = routed.label, routed.fallback
                self.served_by = (routed.provider, routed.model)
                self._end(result=routed.value)
        except asyncio.CancelledError:
            self._end(error=UpstreamError("The request was cancelled.", code="cancelled"))
            raise
        except PrismError as error:
            log.log(
                logging.WARNING if error.status >= 500 else logging.INFO,
                "provider call for request %s failed: %s %s: %s",
                call.request_id,
                error.status,
                error.code,
                error.message,
            )
            self._end(error=error)
        except Exception:
            # A bug must still end every waiter at once, or they would wait for ever.
            log.exception("provider call for request %s failed unexpectedly", call.request_id)
            self._end(error=PrismError("The gateway failed unexpectedly."))

    def _end(
        self, *, result: UpstreamCompletion | None = None, error: PrismError | None = None
    ) -> None:
        if self.done:  # a stream that ended at its end marker may fail while it drains
            return
        self.result, self.error = result, error
        self._notify()
        self._on_end(self)

    async def _stream(self, call: Call) -> None:
        """The stream, relayed event by event as it arrives and rebuilt by the operation's
        builder; the answer is cached only when whole."""
        routed = await self._router.stream(call.body, call.model, call.op)
        self.provider, self.fallback = routed.label, routed.fallback
        self.served_by = (routed.provider, routed.model)
        upstream = routed.value
        builder = call.op.builder(
            routed.provider, call.body, functools.partial(self._router.redact, routed)
        )
        try:
            failure = await self._relay(upstream, builder)
            result = builder.result() if failure is None else None
            if result is not None:
                self._end(result=result)
                self._router.stream_finished(routed)
                if builder.done:
                    # Read to the end of the body, briefly, so the connection goes back to
                    # the pool; a provider that keeps it open is closed below instead.
                    with contextlib.suppress(PrismError, TimeoutError):
                        async with asyncio.timeout(_DRAIN_SECONDS):
                            async for _ in upstream.events:
                                pass
                return
        finally:
            with contextlib.suppress(Exception):
                await upstream.aclose()
        self._broken(routed, failure)

    def _broken(self, routed: Routed[Any], failure: PrismError | None) -> NoReturn:
        """A stream that did not end whole: counted against its provider, then raised.
        (Failures raised by the events iterator are the router's to count; these are ours.)"""
        if failure is None:
            failure = UpstreamError(
                f"Provider '{routed.provider}' ended the stream before the answer was complete.",
                code="upstream_truncated",
            )
        self._router.stream_failed(routed, failure)
        raise failure

    async def _relay(self, upstream: UpstreamStream, builder: StreamBuilder) -> PrismError | None:
        """Publish each event as it arrives, until the stream's end marker or the end of
        the body; a malformed or error event is returned as the failure."""
        frames, usage = self.frames, self.usage_frames
        decoder = SSEDecoder()
        async for raw in upstream.events:
            for data in decoder.feed(raw):
                try:
                    frame = builder.add(data)
                except PrismError as error:
                    return error
                if builder.usage:
                    usage.add(len(frames))
                if frame:
                    frames.append(frame)
                if builder.done:
                    self._notify()
                    return None
            self._notify()
        return None
