"""New index records pushed to every origin process: a Redis pub/sub subscription.

The index's add script publishes the stream's key on ``index.NOTIFY_CHANNEL`` once the
record is in; ``IndexNotifier`` holds one subscription per process (its own connection:
a subscribed connection can run no other command) and hands each key to the index, which
catches up with that partition at once if it mirrors it. When the subscription drops, it
reconnects with a growing pause, and after each (re)subscription every mirrored partition
catches up (what was published meanwhile was lost). Notifications only make records
arrive sooner: the catch-up before each search does not depend on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import redis.asyncio
import redis.exceptions

from .index import NOTIFY_CHANNEL

__all__ = ["IndexNotifier"]

log = logging.getLogger("prism.origin")

_FIRST_PAUSE, _LONGEST_PAUSE = 0.1, 5.0  # between reconnections, doubling


class IndexNotifier:
    def __init__(
        self,
        url: str,
        on_key: Callable[[bytes], None],
        on_subscribed: Callable[[], None],
        timeout: float = 5.0,
    ) -> None:
        self._url = url
        self._on_key = on_key
        self._on_subscribed = on_subscribed
        self._timeout = timeout
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()  # set while the subscription is up
        self.received = 0  # keys handed to the index (for tests and the bench)

    def start(self) -> None:
        """Subscribe (once; later calls do nothing)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        pause = _FIRST_PAUSE
        while True:
            client = redis.asyncio.Redis.from_url(
                self._url, socket_connect_timeout=self._timeout, health_check_interval=30
            )
            try:
                async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(NOTIFY_CHANNEL)
                    self.subscribed.set()
                    pause = _FIRST_PAUSE
                    self._on_subscribed()
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            self.received += 1
                            self._on_key(message["data"])
            except (redis.exceptions.RedisError, OSError) as error:
                log.debug("semantic index notifications: %s; reconnecting", error)
            finally:
                self.subscribed.clear()
                with contextlib.suppress(Exception):
                    await client.aclose()
            # A pause before reconnecting, so a Redis that is down is not hammered.
            await asyncio.sleep(pause)
            pause = min(pause * 2, _LONGEST_PAUSE)

    def stop(self) -> None:
        """Unsubscribe (the task ends at its next turn of the loop; its connection closes)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
