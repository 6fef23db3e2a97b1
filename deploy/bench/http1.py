"""A minimal asyncio HTTP/1.1 client: keep-alive, Content-Length and chunked bodies.

Used where wrk cannot help: time to first byte of a stream, and the load
generator's fallback when wrk is not installed. It is small on purpose, so its
own cost per request stays low and easy to reason about (no redirects, no TLS,
no pooling beyond the one connection it holds).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Connection", "HttpReply", "build_request", "split_url"]


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    headers: dict[str, str]
    body: bytes
    first_body_at: float  # perf_counter() when the first body bytes arrived


def split_url(url: str) -> tuple[str, int, str]:
    """``(host, port, path-with-query)`` of an ``http://`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"only http:// URLs are supported, got {url!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, parts.port or 80, path


def build_request(
    method: str, host: str, port: int, path: str, headers: dict[str, str], body: bytes
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Connection:
    """One keep-alive connection; ``send`` writes a request and reads its whole reply."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        return cls(reader, writer)

    async def send(self, request: bytes) -> HttpReply:
        self._writer.write(request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body, first = await self._read_chunked()
        else:
            length = int(headers.get("content-length", "0"))
            body = await self._reader.readexactly(length) if length else b""
            first = time.perf_counter()
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return HttpReply(status, headers, body, first)

    async def _read_chunked(self) -> tuple[bytes, float]:
        parts: list[bytes] = []
        first = 0.0
        while True:
            size_line = await self._reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                # Trailers (none expected) end with an empty line.
                while await self._reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                return b"".join(parts), first or time.perf_counter()
            chunk = await self._reader.readexactly(size + 2)
            if not first:
                first = time.perf_counter()
            parts.append(chunk[:-2])

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
