"""One provider call shared by every identical request in flight (request coalescing).

``FlightTable.subscribe(key, call)`` joins the flight running for ``key`` or starts
one. Each client holds a ``Subscription`` while it needs the answer::

    async with table.subscribe(key, call) as subscription:
        answer = await subscription.answer(client_gone)      # a JSON client
    ...
    if await subscription.started(client_gone):             # a streaming client
        return subscription.follow(include_usage)           # closing it is the leave

The flight runs in its own task and records what arrives (stream events as they
come, then the answer or the error), so 200 identical misses make one provider
call, every client follows it live at its own pace, and a late joiner gets the
events so far, then the live ones.

Lifecycle: running -> ended (answer or error, every waiter woken at once) ->
forgotten by the table. An answer that is stored stays joinable until its Redis
write has landed, so an identical request that missed Redis just before never
starts a second call; an error is forgotten at once, so the next request starts
afresh. When the last subscriber leaves a running flight, the call is cancelled:
an abandoned generation is not paid for.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, NamedTuple, NoReturn, Protocol

from prism import PrismError, SSEDecoder, UpstreamError

from ..http.asgi import CancelOnce
from ..providers.base import UpstreamCompletion, UpstreamStream
from .operation import Operation, StreamBuilder
from .router import Routed

__all__ = [
    "Call",
    "ClientStream",
    "Flight",
    "FlightRouter",
    "FlightTable",
    "Storage",
    "Store",
    "Subscription",
]

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


# Caches a complete answer: (fingerprint, answer, model, ttl, fallback, semantic) -> the
# pending Redis write, if one was started (the flight stays joinable until it has landed).
Store = Callable[[str, UpstreamCompletion, str, int, bool, Any], "asyncio.Future[Any] | None"]

# Finishes when the client has gone away (``http.disconnect``); made only while waiting.
ClientGone = Callable[[], Awaitable[object]]


class Flight:
    """One shared provider call. Its state is private: clients read it through a
    ``Subscription``, and only the flight's own task writes it."""

    __slots__ = (
        "_call",
        "_error",
        "_fallback",
        "_frames",
        "_key",
        "_on_abandon",
        "_on_end",
        "_provider",
        "_result",
        "_router",
        "_served_by",
        "_subscribers",
        "_task",
        "_usage_frames",
        "_waiters",
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
        self._call = call
        self._router = router
        self._on_end = on_end
        self._on_abandon = on_abandon
        self._frames: list[bytes] = []  # the SSE frames so far, ``data: {chunk}\n\n``
        self._usage_frames: set[int] = set()  # the trailing usage chunk: only if asked for
        self._result: UpstreamCompletion | None = None
        self._error: PrismError | None = None
        self._provider = ""  # what x-prism-provider says
        self._fallback = False
        self._served_by = ("", "")  # (provider, upstream model) that answered
        self._subscribers = 0
        self._waiters: list[asyncio.Future[None]] = []  # one per client waiting for a change
        self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def key(self) -> str | None:
        return self._key

    @property
    def done(self) -> bool:
        return self._result is not None or self._error is not None

    def _started(self) -> bool:
        return bool(self._frames) or self.done

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():  # a waiter cancelled with its client is done already
                waiter.set_result(None)

    async def _next_change(self) -> None:
        """Until the flight publishes something."""
        waiter = self._task.get_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    # -- membership ------------------------------------------------------------------

    def _join(self) -> None:
        self._subscribers += 1

    def _leave(self) -> None:
        self._subscribers -= 1
        if self._subscribers == 0 and not self.done:
            # Nobody waits for this answer any more: stop paying for it. Forgotten first,
            # so an identical request arriving now starts afresh instead of joining a
            # call about to be cancelled.
            self._on_abandon(self)
            self._task.cancel()

    # -- the provider call (the flight's own task) -------------------------------------

    async def _run(self) -> None:
        call = self._call
        try:
            if call.stream:
                await self._stream(call)
            else:
                routed = await self._router.complete(call.body, call.model, call.op)
                self._provider, self._fallback = routed.label, routed.fallback
                self._served_by = (routed.provider, routed.model)
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
        self._result, self._error = result, error
        self._notify()
        self._on_end(self)

    async def _stream(self, call: Call) -> None:
        """The stream, relayed event by event as it arrives and rebuilt by the operation's
        builder; the answer is cached only when whole."""
        routed = await self._router.stream(call.body, call.model, call.op)
        self._provider, self._fallback = routed.label, routed.fallback
        self._served_by = (routed.provider, routed.model)
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
        frames, usage = self._frames, self._usage_frames
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


class Subscription:
    """One client's place in a flight. Leaving (the ``async with`` exit, or closing the
    stream ``follow`` hands out) cancels the call if nobody else is waiting for it."""

    __slots__ = ("_flight", "_held")

    def __init__(self, flight: Flight) -> None:
        flight._join()
        self._flight = flight
        self._held = True  # False once left, or handed to a ClientStream

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.leave()

    def leave(self) -> None:
        if self._held:
            self._held = False
            self._flight._leave()

    @property
    def provider(self) -> str:
        return self._flight._provider

    @property
    def call(self) -> Call:
        """The call of the flight joined: not the subscriber's own when it joined one."""
        return self._flight._call

    @property
    def fallback(self) -> bool:
        return self._flight._fallback

    async def answer(self, client_gone: ClientGone | None = None) -> UpstreamCompletion | None:
        """The complete answer, or None if the client went away first; raises the
        flight's error."""
        flight = self._flight
        if not await self._wait(flight, lambda: flight.done, client_gone):
            return None
        if flight._error is not None:
            raise flight._error.with_traceback(None)
        assert flight._result is not None
        return flight._result

    async def started(self, client_gone: ClientGone | None = None) -> bool:
        """Until the first event arrived or the flight ended; False if the client went
        away first. Raises the flight's error if it failed before its first event."""
        flight = self._flight
        if not await self._wait(flight, flight._started, client_gone):
            return False
        if flight._error is not None and not flight._frames:
            raise flight._error.with_traceback(None)
        return True

    def follow(self, include_usage: bool) -> ClientStream:
        """The client's SSE body; the subscription goes with it (closing it leaves)."""
        assert self._held, "follow() on a subscription that was left"
        self._held = False
        return ClientStream(self._flight, include_usage)

    @staticmethod
    async def _wait(
        flight: Flight, ready: Callable[[], bool], client_gone: ClientGone | None
    ) -> bool:
        if ready():
            return True
        if client_gone is None:
            while not ready():
                await flight._next_change()
            return True
        # The client's leaving is awaited in this task, not in a watcher task of its own
        # (a task per miss is most of the wait's cost): the flight's next change wakes it
        # by cancelling it out of ``client_gone``, as a hedge that wins does.
        me = asyncio.current_task()
        assert me is not None
        wake = CancelOnce(me, armed=False)
        try:
            while not ready():
                waiter = me.get_loop().create_future()
                waiter.add_done_callback(wake)
                flight._waiters.append(waiter)
                wake.armed = True
                try:
                    await client_gone()
                except asyncio.CancelledError:
                    if wake.fired and me.uncancel() == 0:  # our own wake, nothing else
                        wake.fired = False
                        continue
                    raise
                except Exception:
                    return False  # a failed receive() means gone too
                finally:
                    wake.armed = False
                return False
            return True
        finally:
            wake.armed = False


class ClientStream:
    """SSE bytes for one streaming client: the events so far, then the live ones, then
    the operation's end (chat's ``data: [DONE]``) or an error event (never both). Closing
    it leaves the flight."""

    __slots__ = ("_flight", "_include_usage", "_open", "_seen")

    def __init__(self, flight: Flight, include_usage: bool) -> None:
        self._flight = flight
        self._include_usage = include_usage
        self._seen = 0
        self._open = True

    def __aiter__(self) -> ClientStream:
        return self

    async def __anext__(self) -> bytes:
        flight = self._flight
        while self._open:
            frames = flight._frames
            if self._seen < len(frames):
                start = self._seen
                self._seen = end = len(frames)
                usage = flight._usage_frames
                if self._include_usage or not usage:
                    return b"".join(frames[start:end])
                out = b"".join([frames[i] for i in range(start, end) if i not in usage])
                if out:
                    return out
                continue
            if flight.done:
                await self.aclose()
                return self._last(flight)
            await flight._next_change()
        raise StopAsyncIteration

    @property
    def completion(self) -> dict[str, Any] | None:
        """The flight's complete answer once it has one (None while running, or failed)."""
        result = self._flight._result
        return None if result is None else result.completion

    def _last(self, flight: Flight) -> bytes:
        op = flight._call.op
        if flight._error is not None:
            return op.error_frame(flight._error)
        if not flight._frames and flight._result is not None:
            # Joined a non-stream call: its answer, replayed as a stream.
            return op.replay(flight._result, self._include_usage)
        return op.done_frame

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            self._flight._leave()


class FlightTable:
    """The flights running now, by key; identical concurrent requests share one."""

    def __init__(
        self, router: FlightRouter, store: Store, on_join: Callable[[], None] | None = None
    ) -> None:
        self._router = router
        self._store = store
        self._on_join = on_join
        self._flights: dict[str, Flight] = {}

    def __len__(self) -> int:
        """Flights still joinable (running, or answered with their store pending)."""
        return len(self._flights)

    def __contains__(self, key: str | None) -> bool:
        """A flight for ``key`` is joinable now."""
        return key is not None and key in self._flights

    def subscribe(self, key: str | None, call: Call) -> Subscription:
        """Join the flight for ``key``, or start one for ``call``; ``key=None`` never joins."""
        if key is not None:
            flight = self._flights.get(key)
            if flight is not None:
                if self._on_join is not None:
                    self._on_join()
                return Subscription(flight)
        flight = Flight(key, call, self._router, self._ended, self._forget)
        subscription = Subscription(flight)  # joined before the call's task can run
        if key is not None:
            self._flights[key] = flight
        return subscription

    def _forget(self, flight: Flight) -> None:
        key = flight.key
        if key is not None and self._flights.get(key) is flight:
            del self._flights[key]

    def _ended(self, flight: Flight) -> None:
        call, result = flight._call, flight._result
        if call.on_end is not None:
            try:
                call.on_end(result, *flight._served_by)
            except Exception:
                log.exception("accounting for request %s failed", call.request_id)
        pending = None
        if result is not None and call.storage is not None:
            fingerprint, ttl, semantic = call.storage
            try:
                pending = self._store(
                    fingerprint, result, call.model, ttl, flight._fallback, semantic
                )
            except Exception:
                log.exception("storing the answer for request %s failed", call.request_id)
        if pending is None or pending.done():
            self._forget(flight)
        else:
            # Joinable until the entry is in Redis: a request that missed it just before
            # joins here instead of starting a second provider call.
            pending.add_done_callback(functools.partial(self._stored, flight))

    def _stored(self, flight: Flight, write: asyncio.Future[Any]) -> None:
        self._forget(flight)
