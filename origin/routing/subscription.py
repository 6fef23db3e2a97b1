"""A client's hold on a shared provider call (``origin.routing.shared_call.Flight``):
its complete answer, or its stream followed live (the events so far, then the live
ones). Leaving, the last subscriber cancels the call: an abandoned generation is not
paid for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from ..http.asgi import CancelOnce
from ..providers.base import UpstreamCompletion
from .shared_call import Call, Flight

__all__ = ["ClientGone", "ClientStream", "Subscription"]

# Finishes when the client has gone away (``http.disconnect``); made only while waiting.
ClientGone = Callable[[], Awaitable[object]]


class Subscription:
    """One client's place in a flight. Leaving (the ``async with`` exit, or closing the
    stream ``follow`` hands out) cancels the call if nobody else is waiting for it."""

    __slots__ = ("_flight", "_held")

    def __init__(self, flight: Flight) -> None:
        flight.join()
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
            self._flight.leave()

    @property
    def provider(self) -> str:
        return self._flight.provider

    @property
    def attempts(self) -> list[dict[str, Any]]:
        """The flight's provider attempts, noted as they are made (its own or joined)."""
        return self._flight.attempts

    @property
    def call(self) -> Call:
        """The call of the flight joined: not the subscriber's own when it joined one."""
        return self._flight.call

    @property
    def fallback(self) -> bool:
        return self._flight.fallback

    async def answer(self, client_gone: ClientGone | None = None) -> UpstreamCompletion | None:
        """The complete answer, or None if the client went away first; raises the
        flight's error."""
        flight = self._flight
        if not await self._wait(flight, lambda: flight.done, client_gone):
            return None
        if flight.error is not None:
            raise flight.error.with_traceback(None)
        assert flight.result is not None
        return flight.result

    async def started(self, client_gone: ClientGone | None = None) -> bool:
        """Until the first event arrived or the flight ended; False if the client went
        away first. Raises the flight's error if it failed before its first event."""
        flight = self._flight
        if not await self._wait(flight, flight.started, client_gone):
            return False
        if flight.error is not None and not flight.frames:
            raise flight.error.with_traceback(None)
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
                await flight.next_change()
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
                flight.waiters.append(waiter)
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
            frames = flight.frames
            if self._seen < len(frames):
                start = self._seen
                self._seen = end = len(frames)
                usage = flight.usage_frames
                if self._include_usage or not usage:
                    return b"".join(frames[start:end])
                out = b"".join([frames[i] for i in range(start, end) if i not in usage])
                if out:
                    return out
                continue
            if flight.done:
                await self.aclose()
                return self._last(flight)
            await flight.next_change()
        raise StopAsyncIteration

    @property
    def completion(self) -> dict[str, Any] | None:
        """The flight's complete answer once it has one (None while running, or failed)."""
        result = self._flight.result
        return None if result is None else result.completion

    def _last(self, flight: Flight) -> bytes:
        op = flight.call.op
        if flight.error is not None:
            return op.error_frame(flight.error)
        if not flight.frames and flight.result is not None:
            # Joined a non-stream call: its answer, replayed as a stream.
            return op.replay(flight.result, self._include_usage)
        return op.done_frame

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            self._flight.leave()
