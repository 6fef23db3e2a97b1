"""Stopping the loops the origin's parts run in the background for their whole life (the
usage flush, the KV writer, the dashboard's sampler, the model list's publisher, the
revoked-key refresher).

Its own module because those parts sit below the gateway that builds them: they cannot
import it (``Gateway.spawn``, for work after a response, stays with the gateway).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to stop) and return once it has ended."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
