"""Waiting in tests: poll a condition until a deadline, never sleep a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]


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
