"""The request log's durable history: gzip'd JSON lines, partitioned by day and project.

Each ``write`` turns its batch into one file per (UTC day, hour, project), one record a
line, under::

    day=<YYYY-MM-DD>/project=<project>/<HH>-<process>-<digest>.jsonl.gz

(``project=-`` for a request no project was known for, e.g. a bad key). ``<process>``
names the writing process (its pid and a token of its own, so two hosts' pids never
clash) and ``<digest>`` the file's content: the buffer retrying a batch that was partly
written writes the same names again, replacing those files, never a second copy. The
Hive-style folders let ``prism logs query`` (DuckDB) read ``day`` and ``project`` as
columns and skip days a query does not ask for.

Files are whole or absent: a local file is written under a temporary name beginning with
a dot (never matched by ``*.jsonl.gz``), flushed to disk and renamed; an S3 object is put
in one request (atomic). The compression and the I/O run in a thread, so the event loop
never waits on a disk or on S3.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote

from .record import Logged

try:  # Intel ISA-L's deflate (python-isal): a dependency, with wheels for the usual hosts
    from isal.isal_zlib import compress as _deflate
except ImportError:  # a platform it has no wheel for: the standard library's, 5x the CPU
    from zlib import compress as _deflate

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from ..settings import Settings

__all__ = [
    "FLUSH_INTERVAL",
    "FLUSH_RECORDS",
    "FileSink",
    "FileStore",
    "LocalFiles",
    "S3Files",
    "file_sink",
    "partition_files",
]

NO_PROJECT = "-"
# How often the buffer feeding this sink should flush (and at most how many records a
# batch): a query pays a few ms for every file it opens, so fewer, larger files. Measured
# on 180,000 records: 0.9 s in 60 files (a flush a minute), 13 s in 3,600 (a second).
FLUSH_INTERVAL, FLUSH_RECORDS = 60.0, 10_000
# Compressed by ISA-L at its level 1. Measured on 10,000 of the log's own records (a real
# origin's, ~550 bytes of JSON each, ids and digests that do not compress), CPU a record
# and bytes out: zlib level 6 11.8 us, 105 bytes; zlib 1 (used until ISA-L) 4.1 us, 120;
# ISA-L 0 0.80 us, 148; ISA-L 1 0.78 us, 106; ISA-L 3 1.6 us, 106; zlib-ng 1 1.8 us, 158,
# and 2 2.9 us, 109. Both zlib and ISA-L free the GIL while they compress. The sink's whole
# write (grouping, join, compression, digest, the file) went 34,500 -> 11,300 instructions
# a record with it (callgrind, Redis hits' records).
_COMPRESSION = 1
_GZIP = 31  # wbits: one gzip member, with no time in its header (mtime 0)


class FileStore(Protocol):
    """Where the files go: ``put`` stores one whole file or raises (blocking: a thread
    runs it)."""

    def put(self, name: str, data: bytes) -> None: ...

    def close(self) -> None: ...


def partition_files(records: Sequence[Logged], process: str) -> dict[str, bytes]:
    """The batch as files: {relative name: gzip'd JSON lines}."""
    groups: dict[tuple[int, str], list[bytes]] = {}
    for line, ts, project, _ in records:
        key = (int(ts) // 3600, project or NO_PROJECT)
        group = groups.get(key)
        if group is None:
            groups[key] = [line]
        else:
            group.append(line)
    files: dict[str, bytes] = {}
    for (hours, project), lines in groups.items():
        day, hour = datetime.fromtimestamp(hours * 3600, UTC).strftime("%Y-%m-%d %H").split()
        lines.append(b"")  # the last line's newline, without copying the joined text again
        # The same lines give the same bytes (no time in the header): the digest of those
        # names the content, for a fifth of the hashing.
        data = _deflate(b"\n".join(lines), _COMPRESSION, _GZIP)
        digest = hashlib.blake2b(data, digest_size=8).hexdigest()
        folder = f"day={day}/project={quote(project, safe='')}"
        files[f"{folder}/{hour}-{process}-{digest}.jsonl.gz"] = data
    return files


class FileSink:
    """A ``RecordSink`` (``origin.requestlog.sink``) writing durable files to a store."""

    name = "files"
    flush_interval = FLUSH_INTERVAL  # its buffer's batches
    flush_records = FLUSH_RECORDS

    def __init__(self, store: FileStore) -> None:
        self.store = store
        self._process = f"{os.getpid()}.{secrets.token_hex(3)}"

    async def write(self, records: Sequence[Logged]) -> None:
        if records:
            await asyncio.to_thread(self._write, list(records))

    def _write(self, records: list[Logged]) -> None:
        for name, data in partition_files(records, self._process).items():
            self.store.put(name, data)

    async def close(self) -> None:
        await asyncio.to_thread(self.store.close)


class LocalFiles:
    """Files in a local directory (``PRISM_LOG_DIR``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with temporary.open("wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())  # on disk before it has its name
            temporary.replace(path)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise

    def close(self) -> None:
        pass


class S3Files:
    """Objects in an S3 bucket under a prefix (``PRISM_LOG_BUCKET``, ``PRISM_LOG_PREFIX``)."""

    def __init__(self, client: S3Client, bucket: str, prefix: str) -> None:
        self.client, self.bucket, self.prefix = client, bucket, prefix

    def put(self, name: str, data: bytes) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=self.prefix + name, Body=data, ContentType="application/gzip"
        )

    def close(self) -> None:
        self.client.close()


def file_sink(settings: Settings) -> FileSink | None:
    """The durable sink the settings ask for (None: neither a directory nor a bucket)."""
    if settings.log_bucket:
        import boto3  # only an origin writing to S3 pays for importing it
        from botocore.config import Config

        # Few, short attempts: the buffer retries a failed batch itself, with its backoff.
        config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3})
        client = boto3.client("s3", config=config)
        return FileSink(S3Files(client, settings.log_bucket, settings.log_prefix))
    if settings.log_dir:
        return FileSink(LocalFiles(Path(settings.log_dir)))
    return None
