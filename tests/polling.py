"""Waiting in tests: poll a condition until a deadline, never sleep a guessed time."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar, overload

__all__ = ["async_wait_for", "wait_for"]


T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | Literal[False] | None],
    timeout: float = 15.0,
    interval: float = 0.02,
) -> T:
    """Poll until ``predicate`` returns something truthy, and return it (never the ``None``
    or ``False`` it may return meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


@overload
async def async_wait_for(
    predicate: Callable[[], Awaitable[T | Literal[False] | None]],
    within: float = 15.0,
    interval: float = 0.02,
) -> T: ...


@overload
async def async_wait_for(
    predicate: Callable[[], T | Literal[False] | None], within: float = 15.0, interval: float = 0.02
) -> T: ...


async def async_wait_for(
    predicate: Callable[[], Awaitable[object] | object],
    within: float = 15.0,
    interval: float = 0.02,
) -> object:
    """``wait_for`` inside an event loop (the loop runs between polls); ``predicate`` may
    be a plain function or a coroutine function."""
    deadline = time.monotonic() + within
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(interval)
