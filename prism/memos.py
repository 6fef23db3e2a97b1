"""What a half has seen recently: the work a repeat would otherwise redo.

A cache gateway sees the same request bodies and serves the same stored entries
again and again (that is what a hit is), so parsing, canonicalising and checking
each one once saves that work on every repeat, at the origin and in each edge
isolate alike. Both memos are bounded: cleared when full, and refilled by what
is hot at once. Keys are the exact input, so a memo never answers for another.
"""

from __future__ import annotations

from typing import Final, Generic, TypeVar

from .envelope import Envelope
from .envelope import decode as decode_envelope

R = TypeVar("R")

__all__ = ["RecentBodies", "RecentEntries"]


def _memory_size(raw: bytes | str) -> int:
    """Bytes held in memory, at most: CPython stores a non-ASCII str at up to 4 per char."""
    return len(raw) if isinstance(raw, bytes) or raw.isascii() else 4 * len(raw)


class RecentBodies(Generic[R]):
    """Parsed requests (a ``ChatRequest``, or another API's) and fingerprints of recently
    seen bodies, per project.

    The ``ChatRequest`` handed out (and its ``body`` dict) is shared by every request
    that sends the same bytes: it is never mutated. Whoever needs a changed body builds
    a new one (``{**body, "model": upstream}``); ``tests/origin/test_shared_bodies.py``
    runs every provider on a remembered body to hold them to it.
    """

    __slots__ = ("_items", "_size")

    # Bodies larger than this are not kept: worst case 1,024 x 16 KiB = 16 MiB.
    MAX_BODY: Final = 16 * 1024  # Final: a class constant where mypyc compiles this module

    def __init__(self, size: int = 1024) -> None:
        self._items: dict[tuple[str, bytes | str], tuple[R, str]] = {}
        self._size = size

    def get(self, project: str, raw: bytes | str) -> tuple[R, str] | None:
        return self._items.get((project, raw))

    def put(self, project: str, raw: bytes | str, chat: R, fp: str) -> None:
        if _memory_size(raw) > self.MAX_BODY:
            return
        if len(self._items) >= self._size:
            self._items.clear()
        self._items[(project, raw)] = (chat, fp)


class RecentEntries:
    """Decoded envelopes of recently served entries, so a hot hit skips the JSON
    metadata parse and the checksum. Expiry is still checked on every use."""

    __slots__ = ("_items", "_size")

    # Worst case 256 x 64 KiB = 16 MiB; a typical completion is a few KiB.
    MAX_ENTRY: Final = 64 * 1024

    def __init__(self, size: int = 256) -> None:
        self._items: dict[bytes | str, Envelope] = {}
        self._size = size

    def decode(self, raw: bytes | str, now: float) -> Envelope | None:
        """``decode_envelope(raw, now)``, remembered for small entries."""
        envelope = self._items.get(raw)
        if envelope is None:
            envelope = decode_envelope(raw, now)
            if envelope is None or _memory_size(raw) > self.MAX_ENTRY:
                return envelope
            if len(self._items) >= self._size:
                self._items.clear()
            self._items[raw] = envelope
            return envelope
        return envelope if now < envelope.expires_at() else None
