"""Waiting in tests: poll a condition until a deadline, never sleep a guessed time."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["async_wait_for", "wait_for"]


T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 15.0, interval: float = 0.02) -> T:
    """Poll until ``predicate`` returns something truthy, and return it."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


async def async_wait_for(
    predicate: Callable[[], Awaitable[T] | T], within: float = 15.0, interval: float = 0.02
) -> T:
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
