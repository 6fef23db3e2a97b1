"""One partition's records in this process's memory, for similarity search at scale.

A ``Mirror`` holds what the partition's Redis stream says, row by row: the vectors as
float16 (half the memory of float32; a cosine off by under 1e-3), one sign bit per
dimension, packed and stored column by column, and each row's expiry, fingerprint and
question text. A search over a few thousand rows scores them all. Beyond that it first
ranks every row by Hamming distance between sign bits (six 64-bit words per row for
384 dimensions: a few XORs and popcounts, ~0.4 ms for 100,000 rows), then scores the
``SHORTLIST`` nearest exactly: two vectors with cosine 0.9 differ in about 14 % of
their signs, unrelated ones in about half, so a paraphrase above any useful threshold
is on the shortlist unless hundreds of rows are closer still.

Rows are only appended (the stream is a log); a removal or a newer record for the same
fingerprint marks the old row dead, and ``compact`` drops dead and expired rows once
they are half of the mirror. Not thread-safe: the event loop's thread owns it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["EXACT_UP_TO", "SHORTLIST", "Candidate", "Mirror"]

EXACT_UP_TO = 4096  # rows scored one by one below this many (the shortlist would not pay)
SHORTLIST = 256  # rows scored exactly, out of the nearest by sign bits


class Candidate(NamedTuple):
    """A record close to the question: what a search returns."""

    fingerprint: str  # the entry's: prism:v1:<fingerprint>
    score: float
    text: str


class Mirror:
    def __init__(self, dimensions: int, capacity: int = 64) -> None:
        self._allocate(dimensions, capacity)
        self.dead = 0  # rows removed or replaced
        self.last_id = b"-"  # the last stream entry read ("-": none yet)
        self._fingerprints: list[str] = []
        self._texts: list[str] = []
        self._rows: dict[str, int] = {}

    def resize(self, dimensions: int) -> None:
        """Another vector width, while the mirror is still empty."""
        if self.size:
            raise ValueError("resize: the mirror has rows")
        self._allocate(dimensions, 64)

    def _allocate(self, dimensions: int, capacity: int) -> None:
        self.dimensions = dimensions
        self.words = (dimensions + 63) // 64
        self.size = 0  # rows used (live, dead and expired)
        self._vectors = np.zeros((capacity, dimensions), dtype=np.float16)
        self._bits = np.zeros((self.words, capacity), dtype=np.uint64)
        self._expires = np.zeros(capacity, dtype=np.int64)  # 0: dead

    @property
    def live(self) -> int:
        """Rows neither removed nor replaced (some may have expired since)."""
        return self.size - self.dead

    def nbytes(self) -> int:
        """Memory held by the arrays (the Python strings come on top)."""
        return self._vectors.nbytes + self._bits.nbytes + self._expires.nbytes

    def _signs(self, vectors: npt.NDArray[np.float16]) -> npt.NDArray[np.uint64]:
        packed = np.packbits(vectors > 0, axis=1)  # (rows, dimensions / 8)
        padded = np.zeros((len(vectors), self.words * 8), dtype=np.uint8)
        padded[:, : packed.shape[1]] = packed
        return padded.view(np.uint64)  # (rows, words)

    def _grow(self, needed: int) -> None:
        capacity = len(self._expires)
        if needed <= capacity:
            return
        # A quarter more each time: copies stay amortised, and at most a fifth is unused.
        capacity = max(needed, capacity + capacity // 4, 64)
        vectors = np.zeros((capacity, self.dimensions), dtype=np.float16)
        vectors[: self.size] = self._vectors[: self.size]
        bits = np.zeros((self.words, capacity), dtype=np.uint64)
        bits[:, : self.size] = self._bits[:, : self.size]
        expires = np.zeros(capacity, dtype=np.int64)
        expires[: self.size] = self._expires[: self.size]
        self._vectors, self._bits, self._expires = vectors, bits, expires

    def append(
        self, fingerprints: list[str], expiries: list[int], vectors: bytes, texts: list[str]
    ) -> None:
        """Rows in stream order; ``vectors`` is their float16 vectors, concatenated."""
        matrix = np.frombuffer(vectors, dtype="<f2").reshape(len(fingerprints), -1)
        start = self.size
        self._grow(start + len(fingerprints))
        self._vectors[start : start + len(fingerprints)] = matrix
        self._bits[:, start : start + len(fingerprints)] = self._signs(matrix).T
        self._expires[start : start + len(fingerprints)] = expiries
        for offset, fingerprint in enumerate(fingerprints):
            self._forget(fingerprint)
            self._rows[fingerprint] = start + offset
        self._fingerprints.extend(fingerprints)
        self._texts.extend(texts)
        self.size += len(fingerprints)

    def _forget(self, fingerprint: str) -> None:
        row = self._rows.pop(fingerprint, None)
        if row is not None and self._expires[row]:
            self._expires[row] = 0
            self.dead += 1

    def holds(self, fingerprint: str, expires: int) -> bool:
        """A live row for ``fingerprint`` with this expiry (the same record) is here."""
        row = self._rows.get(fingerprint)
        return row is not None and int(self._expires[row]) == expires

    def remove(self, fingerprint: str) -> None:
        self._forget(fingerprint)

    def nearest(
        self, query: npt.NDArray[np.float32], threshold: float, count: int, now: float
    ) -> list[Candidate]:
        """Up to ``count`` live rows scoring at least ``threshold``, best first."""
        size = self.size
        if size == 0 or len(query) != self.dimensions:
            return []
        if size <= EXACT_UP_TO:
            rows = np.arange(size)
        else:
            signs = self._signs(query.astype(np.float16)[None, :])[0]
            distance = np.bitwise_count(self._bits[0, :size] ^ signs[0])
            for word in range(1, self.words):
                distance += np.bitwise_count(self._bits[word, :size] ^ signs[word])
            rows = np.argpartition(distance, SHORTLIST)[:SHORTLIST]
        scores = self._vectors[rows].astype(np.float32) @ query
        keep = (scores >= threshold) & (self._expires[rows] > now)
        rows, scores = rows[keep], scores[keep]
        order = np.argsort(-scores)[:count]
        return [
            Candidate(self._fingerprints[r], float(s), self._texts[r])
            for r, s in zip(rows[order].tolist(), scores[order].tolist(), strict=True)
        ]

    def compact(self, now: float) -> None:
        """Drop dead and expired rows once they are at least half of the mirror."""
        alive = self._expires[: self.size] > now
        kept = int(alive.sum())
        if self.size - kept < max(self.size // 2, 1):
            return
        rows = np.flatnonzero(alive)
        self._vectors = np.ascontiguousarray(self._vectors[rows])
        self._bits = np.ascontiguousarray(self._bits[:, rows])
        self._expires = self._expires[rows]
        self._fingerprints = [self._fingerprints[r] for r in rows.tolist()]
        self._texts = [self._texts[r] for r in rows.tolist()]
        self._rows = {fp: i for i, fp in enumerate(self._fingerprints)}
        self.size, self.dead = kept, 0
