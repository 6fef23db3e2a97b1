"""One provider call shared by every identical request in flight: what it asks
(``Call``), where its answer is stored (``Storage``), and the ``Flight`` that runs it in
its own task, recording what arrives (stream events as they come, then the answer or
the error) for its subscribers (``origin.routing.subscription``) to read at their own
pace. ``origin.routing.coalescing`` is where identical requests find it.

With shared flights on (``origin.routing.flight_lease``), a flight starts from its key's
lease (as the request's Redis lookup found it: taken there, or another's; else it asks):
holding it, it calls the provider and appends what arrives to its stream for other
processes, after its own subscribers are woken; finding another process's flight there, it
follows that stream instead, recording the same events the same way, so its subscribers
cannot tell the difference.

A chat stream that breaks after part of it was relayed may be finished by another target
(``origin.routing.resume``): its frames follow the first part's in the same flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import orjson

from prism import PrismError, SSEDecoder, UpstreamError

from ..connection.redis_client import RedisClientError
from ..governance.resumed_bill import Resumption
from ..providers.base import UpstreamCompletion, UpstreamStream
from .flight_lease import FlightLeases, Lease
from .operation import Operation, StreamBuilder
from .resume import Asked, Relay, Resumer, resume
from .router import Routed

__all__ = ["Call", "CallEnd", "Flight", "FlightRouter", "Storage"]

_DRAIN_SECONDS = 1.0  # after [DONE]: how long the rest of a body may take to end
_TAKE_OVERS = 2  # lost leaders a flight follows another after, before it calls on its own
log = logging.getLogger("prism.origin")

# How following another process's flight ended.
_FOLLOWED, _TAKE_OVER, _OWN = "follow", "take_over", "own"


Served = tuple[str, str] | tuple[str, str, Resumption]


class FlightRouter(Protocol):
    """What a flight calls on the router: ``origin.routing.router.Router`` (or a stand-in)."""

    async def complete(
        self,
        body: dict[str, Any],
        model: str,
        op: Operation,
        tried: list[dict[str, Any]] | None = None,
    ) -> Routed[UpstreamCompletion]: ...

    async def stream(
        self,
        body: dict[str, Any],
        model: str,
        op: Operation,
        tried: list[dict[str, Any]] | None = None,
    ) -> Routed[UpstreamStream]: ...

    def stream_failed(self, routed: Routed[UpstreamStream], error: PrismError) -> None: ...

    def stream_finished(self, routed: Routed[UpstreamStream]) -> None: ...

    def redact(self, routed: Routed[Any], message: str) -> str: ...


class CallEnd(Protocol):
    """Told once when the call ends (``origin.governance.billing.Charge``)."""

    def __call__(
        self,
        result: UpstreamCompletion | None,
        provider: str,
        upstream: str,
        resumption: Resumption | None = None,
    ) -> None:
        """The call this request started ended: its answer (None: failed or abandoned);
        ``resumption``: ``provider`` continued a stream another one broke, and each is
        billed for its part (``origin.governance.resumed_bill``)."""

    def joined(self) -> None:
        """Another call answered this request: it pays nothing."""


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
    # Told once when the call ends: (answer or None, provider, upstream model, and for a
    # resumed stream what the broken part used). The request that started the flight
    # pays for it (``origin/governance/billing.py``), unless another process's call
    # answered it (``joined``).
    on_end: CallEnd | None = None
    # Told the answer and the provider that gave it, when this call's own provider answered
    # (an API that keeps a note of it: a stored response's owner).
    on_answer: Callable[[UpstreamCompletion, str], None] | None = None
    # The flight whose lease the request's Redis lookup found (its own, taken there, or
    # another process's: followed with no claim of its own); None: the flight claims it.
    flight: bytes | None = None


class Flight:
    """One shared provider call. Its state is read by its subscriptions
    (``origin.routing.subscription``) and written only by the flight's own task."""

    __slots__ = (
        "_key",
        "_lease",
        "_leases",
        "_on_abandon",
        "_on_end",
        "_publishing",
        "_router",
        "_subscribers",
        "_task",
        "attempts",
        "call",
        "error",
        "fallback",
        "frames",
        "provider",
        "published",
        "remote",
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
        leases: FlightLeases | None = None,
    ) -> None:
        self._key = key
        self._leases = leases if key is not None else None
        self._lease: Lease | None = None  # held while this process leads the shared call
        self.published = 0  # frames appended to the lease's stream so far
        self._publishing = False  # a publish to the lease's stream is scheduled
        self.remote = False  # the answer (or the failure) came from another process's call
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
        # (provider, upstream model) that answered; then the resumption, when the stream
        # was resumed: the call's end is told ``*served_by``.
        self.served_by: Served = ("", "")
        self.attempts: list[dict[str, Any]] = []  # each provider attempt's outcome, as made
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
        if self._lease is not None and not self._publishing:
            # Behind the waiters' wake-ups: this process's clients get their frames before
            # the stream's write for other processes is packed.
            self._publishing = True
            self._task.get_loop().call_soon(self._publish)

    def _publish(self) -> None:
        """What is new since the last publish, appended to the lease's stream: the frames,
        then the end (the answer, the failure, or the call abandoned)."""
        self._publishing = False
        lease = self._lease
        if lease is None:
            return
        if self.published < len(self.frames):
            lease.frames(self.frames, self.usage_frames, self.published)
            self.published = len(self.frames)
        result, error = self.result, self.error
        if result is not None:  # a stored answer's lease lingers: see flight_lease
            lease.end("r", result.body, linger=self.call.storage is not None)
        elif error is not None and error.code == "cancelled":
            lease.end("a", b"", linger=False)  # abandoned here: another process takes over
        elif error is not None:
            lease.end("x", orjson.dumps([error.message, error.code]), linger=False)

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
            if self._leases is not None and await self._shared(self._leases):
                return
            if call.stream:
                await self._stream(call)
            else:
                routed = await self._router.complete(call.body, call.model, call.op, self.attempts)
                self._routed(routed)
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
        self._notify()  # the lease's end is published after the clients are woken
        self._on_end(self)

    def _routed(self, routed: Routed[Any]) -> None:
        self.provider, self.fallback = routed.label, routed.fallback
        self.served_by = (routed.provider, routed.model)
        if self._lease is not None:
            self._lease.head(routed.label, routed.fallback, routed.provider, routed.model)

    # -- another process's call (shared flights) ---------------------------------------

    async def _shared(self, leases: FlightLeases) -> bool:
        """Lead the key's shared call (False: call the provider) or follow the one running
        (True: this flight ended with it)."""
        key = self._key
        assert key is not None
        found = self.call.flight
        for attempt in range(_TAKE_OVERS + 1):
            claim: Lease | bytes | None = None
            if attempt == 0:
                # A lookup of this process took the lease (lead with it), or found another
                # flight holding it (follow that): no claim of this flight's own.
                claim = leases.adopt(key) or found
            if claim is None:
                try:
                    claim = await leases.claim(key)
                except RedisClientError:
                    leases.counted(_OWN)
                    return False  # Redis cannot say: call, as a process alone would
            if isinstance(claim, Lease):
                self._lease = claim
                leases.counted("lead" if attempt == 0 else _TAKE_OVER)
                return False
            outcome = await self._follow(leases, key, claim)
            if outcome != _TAKE_OVER:
                leases.counted(outcome)
                return outcome == _FOLLOWED
        leases.counted(_OWN)
        return False

    async def _follow(self, leases: FlightLeases, key: str, flight: bytes) -> str:
        """Record another process's flight as it arrives, until it ends (``_FOLLOWED``),
        its leader is lost (``_TAKE_OVER``) or it failed or kept silent (``_OWN``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + leases.wait_limit(self.call.model, self.call.stream)
        after = b"0-0"
        while True:
            try:
                holder: bytes | None = flight
                entries = await leases.read(key, flight, after)
                if not entries:  # quiet: does its leader still hold on?
                    holder, entries = await leases.poll(key, flight, after)
            except RedisClientError:
                return self._lost(_OWN)
            for _, field, value in entries:
                outcome = self._heard(field, value)
                if outcome is not None:
                    return outcome
            if entries:
                after = entries[-1][0]
                self._notify()
            elif holder != flight:
                return self._lost(_TAKE_OVER)
            elif not self.started() and loop.time() > deadline:
                return _OWN

    def _heard(self, field: bytes, value: bytes) -> str | None:
        """One entry of the followed flight's stream; an outcome when it was the last."""
        if field == b"f":
            self.frames.append(value)
        elif field == b"u":
            self.usage_frames.add(len(self.frames))
            self.frames.append(value)
        elif field == b"h":
            self.provider, self.fallback, *served = orjson.loads(value)
            self.served_by = (served[0], served[1])
        elif field == b"r":
            self.remote = True
            self._end(result=UpstreamCompletion(value, orjson.loads(value)))
            return _FOLLOWED
        elif field == b"x":  # not shared as an answer: call again, unless part was relayed
            message, code = orjson.loads(value)
            return self._lost(_OWN, UpstreamError(message, code=code))
        elif field == b"a":
            return self._lost(_TAKE_OVER)
        return None

    def _lost(self, outcome: str, error: PrismError | None = None) -> str:
        """The followed flight ended without an answer: ``outcome`` if nothing of it was
        relayed yet; else its clients' streams end here, as a stream that breaks does."""
        if not self.frames:
            return outcome
        self.remote = True
        self._end(
            error=error
            or UpstreamError(
                "The gateway process relaying this stream went away before it was complete.",
                code="upstream_truncated",
            )
        )
        return _FOLLOWED

    async def _stream(self, call: Call) -> None:
        """The stream, relayed event by event as it arrives and rebuilt by the operation's
        builder; the answer is cached only when whole."""
        routed = await self._router.stream(call.body, call.model, call.op, self.attempts)
        self._routed(routed)
        upstream = routed.value
        builder = call.op.builder(
            routed.provider, call.body, functools.partial(self._router.redact, routed)
        )
        raised = False  # the failure came from the events iterator, which reported it
        try:
            try:
                failure = await self._relay(upstream, builder)
            except PrismError as error:
                if not self.frames or not isinstance(self._router, Resumer):
                    raise
                failure, raised = error, True
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
        await self._broken(routed, failure, builder, raised)

    async def _broken(
        self, routed: Routed[Any], failure: PrismError | None, builder: StreamBuilder, raised: bool
    ) -> None:
        """A stream that did not end whole: counted against its provider, then continued
        by another target (``origin.routing.resume``) or raised. (Failures raised by the
        events iterator are the router's to count; the others are ours.)"""
        if failure is None:
            failure = UpstreamError(
                f"Provider '{routed.provider}' ended the stream before the answer was complete.",
                code="upstream_truncated",
            )
        if not raised:
            self._router.stream_failed(routed, failure)
        router, call = self._router, self.call
        if self.frames and isinstance(router, Resumer):
            resumed = await resume(
                router,
                Relay(self.frames, self.usage_frames, self._notify),
                Asked(call.body, call.model, call.op, call.request_id),
                routed,
                failure,
                builder,
            )
            if resumed is not None:
                # Served by the provider that finished it, each part billed to its own
                # provider; x-prism-provider, long sent, still names the first.
                routed = resumed.routed
                self.served_by = (routed.provider, routed.model, resumed.resumption)
                # Stored (``resume_store``) as the first part's answer would have been: a
                # repair of its stream, not a failover.
                if not resumed.store:
                    self.call = call._replace(storage=None)
                self._end(result=resumed.result)
                return
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
