"""The durable files sink on a real disk and on S3 (moto): one gzip'd JSON-lines file per
day, hour and project of a batch, read back whole; a retried batch replacing its files
rather than doubling them; a target that is gone raising, with nothing half-written left
to read, even when the disk fills mid-file or the process is killed mid-write."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from botocore.config import Config

from deploy.local.ports import free_port
from origin import Settings
from origin.requestlog.files import FileSink, LocalFiles, S3Files, file_sink
from origin.settings import SettingsError
from tests.fixtures.aws import MockAws
from tests.fixtures.origin import OriginFactory, origin_env
from tests.origin.requestlog.samples import DAY, THURSDAY, drive, lines, record
from tests.polling import wait_for


def read_tree(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Every ``*.jsonl.gz`` under ``root``, by relative path, its records decoded."""
    return {
        str(path.relative_to(root)): [
            orjson.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()
        ]
        for path in sorted(root.rglob("*.jsonl.gz"))
    }


def test_a_batch_becomes_one_file_per_day_hour_and_project(tmp_path: Path) -> None:
    batch = [
        *(record(i) for i in range(5)),
        *(record(i, project="beta") for i in range(5, 8)),
        record(8, ts=THURSDAY + DAY),  # the next UTC day
        record(9, ts=THURSDAY + 3600),  # the next hour
        record(10, project=None),  # e.g. a bad key: no project known
    ]
    sink = FileSink(LocalFiles(tmp_path))
    asyncio.run(sink.write(lines(batch)))

    tree = read_tree(tmp_path)
    folders = sorted((name.rsplit("/", 1)[0], name.rsplit("/", 1)[1][:3]) for name in tree)
    assert folders == [
        ("day=2025-12-04/project=-", "13-"),
        ("day=2025-12-04/project=acme", "13-"),
        ("day=2025-12-04/project=acme", "14-"),
        ("day=2025-12-04/project=beta", "13-"),
        ("day=2025-12-05/project=acme", "13-"),
    ]
    written = sorted((r for records in tree.values() for r in records), key=lambda r: r["id"])
    assert written == batch  # every field, as JSON
    [acme] = [records for name, records in tree.items() if "12-04/project=acme/13-" in name]
    assert [r["id"] for r in acme] == [f"req-{i:06d}" for i in range(5)]  # in order
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".jsonl.gz")]


def test_a_retried_batch_replaces_its_files_and_never_doubles_a_record(tmp_path: Path) -> None:
    batch = [record(i) for i in range(20)] + [record(i, project="beta") for i in range(20, 30)]
    sink = FileSink(LocalFiles(tmp_path))

    async def twice() -> None:
        await sink.write(lines(batch))
        await sink.write(lines(batch))  # the buffer retrying a batch it thought had failed
        await sink.write(lines([record(30)]))

    asyncio.run(twice())
    tree = read_tree(tmp_path)
    assert len(tree) == 3
    assert sorted(r["id"] for records in tree.values() for r in records) == sorted(
        r["id"] for r in [*batch, record(30)]
    )


_PARTITION = """
import sys
if sys.argv[1] == "zlib":
    sys.modules["isal"] = None  # a platform without isal's wheel: the import fails
import orjson
from origin.requestlog.files import _deflate, partition_files
from tests.origin.requestlog.samples import lines, record

batch = [record(i) for i in range(300)] + [record(i, project="beta") for i in range(300, 400)]
files = partition_files(lines(batch), "7.abcdef")
assert partition_files(lines(batch), "7.abcdef") == files  # deterministic: the same names, bytes
print(_deflate.__module__)
sys.stdout.flush()
sys.stdout.buffer.write(orjson.dumps({name: data.hex() for name, data in files.items()}))
"""


@pytest.mark.parametrize("compressor", ["isal", "zlib"])
def test_a_file_is_plain_gzip_with_no_time_in_it_with_isal_or_without(compressor: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PARTITION), compressor],
        capture_output=True,
        check=True,
        cwd=Path(__file__).parents[3],
    )
    module, found = done.stdout.split(b"\n", 1)
    assert module.decode() == {"isal": "isal.isal_zlib", "zlib": "zlib"}[compressor]
    files = {name: bytes.fromhex(data) for name, data in orjson.loads(found).items()}
    assert len(files) == 2
    for name, data in files.items():
        # One gzip member: deflate, no flags (no name, no comment), mtime 0.
        assert data[:3] == b"\x1f\x8b\x08" and data[3] == 0 and data[4:8] == bytes(4)
        text = gzip.decompress(data)
        assert text.endswith(b"\n") and not text.endswith(b"\n\n")
        decoded = [orjson.loads(line) for line in text.splitlines()]
        project = "beta" if "project=beta" in name else "acme"
        first = 300 if project == "beta" else 0
        assert decoded == [record(i, project=project) for i in range(first, first + len(decoded))]


def test_a_directory_that_cannot_be_made_raises_and_the_driver_writes_once_it_can(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the directory should be")
    sink = FileSink(LocalFiles(blocker / "requests"))
    with pytest.raises(OSError):
        asyncio.run(sink.write(lines([record(1)])))

    def unblock(error: Exception) -> None:
        assert isinstance(error, OSError)
        blocker.unlink()  # the directory can be made now

    assert asyncio.run(drive(sink, [record(i) for i in range(2500)], on_failure=unblock)) == 1
    tree = read_tree(blocker / "requests")
    assert sorted(r["id"] for records in tree.values() for r in records) == [
        f"req-{i:06d}" for i in range(2500)
    ]


_WRITER = """
import asyncio, resource, signal, sys
from pathlib import Path
from origin.requestlog.files import FileSink, LocalFiles
from tests.origin.requestlog.samples import lines, record

root, mode = Path(sys.argv[1]), sys.argv[2]
sink = FileSink(LocalFiles(root))
batch = [record(i, body={"request": "x" * 2000, "response": str(i) * 500}) for i in range(3000)]
if mode == "full":
    # A disk that fills mid-file: past 64 KiB every write fails (EFBIG, not a signal).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (65_536, 65_536))
    try:
        asyncio.run(sink.write(lines(batch)))
    except OSError as error:
        print("raised", error.errno)
else:
    async def forever():
        for n in range(10_000):
            await sink.write(lines([dict(r, id=f"{n}-{r['id']}") for r in batch]))
    asyncio.run(forever())
"""


def _writer(root: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_WRITER), str(root), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[3],
    )


def test_a_disk_full_mid_file_raises_and_leaves_nothing_behind(tmp_path: Path) -> None:
    writer = _writer(tmp_path, "full")
    out, _ = writer.communicate(timeout=60)
    assert out.split() == ["raised", "27"]  # EFBIG
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # no file, no temporary


def test_a_writer_killed_mid_write_leaves_only_whole_files(tmp_path: Path) -> None:
    writer = _writer(tmp_path, "forever")
    try:
        wait_for(lambda: len(list(tmp_path.rglob("*.jsonl.gz"))) >= 2, timeout=60)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(10)
    finally:
        writer.kill()
        writer.wait()
    tree = read_tree(tmp_path)  # every file decompresses whole and parses
    assert tree and all(len(records) == 3000 for records in tree.values())


def test_s3_objects_are_the_same_files_under_the_prefix(aws: MockAws) -> None:
    s3 = aws.client("s3")
    s3.create_bucket(
        Bucket="prism-request-logs", CreateBucketConfiguration={"LocationConstraint": "ap-south-1"}
    )
    settings = Settings.from_env(
        origin_env("redis://127.0.0.1:1/0", "http://127.0.0.1:1", PRISM_LOG_BUCKET="prism-request-logs",
                   PRISM_LOG_PREFIX="origin/main/logs")
    )  # fmt: skip
    sink = file_sink(settings)
    assert sink is not None and isinstance(sink.store, S3Files)
    asyncio.run(sink.write(lines([record(i) for i in range(10)] + [record(10, project="beta")])))
    asyncio.run(sink.close())

    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="prism-request-logs")["Contents"])
    assert [k.rsplit("/", 1)[0] for k in keys] == [
        "origin/main/logs/day=2025-12-04/project=acme",
        "origin/main/logs/day=2025-12-04/project=beta",
    ]
    stored = s3.get_object(Bucket="prism-request-logs", Key=keys[0])
    assert stored["ContentType"] == "application/gzip"
    stored_lines = gzip.decompress(stored["Body"].read()).splitlines()
    assert [orjson.loads(line)["id"] for line in stored_lines] == [
        f"req-{i:06d}" for i in range(10)
    ]


def test_an_s3_endpoint_that_is_down_raises(aws: MockAws) -> None:
    down = aws.session.client(
        "s3",
        region_name=aws.region,
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        config=Config(connect_timeout=1, retries={"max_attempts": 1}),
    )
    sink = FileSink(S3Files(down, "logs", "requests/"))
    with pytest.raises(Exception, match="Could not connect"):
        asyncio.run(sink.write(lines([record(1)])))


def test_no_directory_and_no_bucket_means_no_sink() -> None:
    settings = Settings.from_env(origin_env("redis://127.0.0.1:1/0", "http://127.0.0.1:1"))
    assert file_sink(settings) is None
    with_dir = Settings.from_env(
        origin_env("redis://127.0.0.1:1/0", "http://127.0.0.1:1", PRISM_LOG_DIR="/tmp/x")
    )
    sink = file_sink(with_dir)
    assert sink is not None and isinstance(sink.store, LocalFiles)


def test_a_directory_and_a_bucket_at_once_is_a_settings_error() -> None:
    env = origin_env("redis://127.0.0.1:1/0", "http://127.0.0.1:1", PRISM_LOG_DIR="/tmp/x",
                     PRISM_LOG_BUCKET="prism-request-logs")  # fmt: skip
    with pytest.raises(SettingsError, match="PRISM_LOG_DIR or PRISM_LOG_BUCKET"):
        Settings.from_env(env)
    prefix = Settings.from_env({**env, "PRISM_LOG_DIR": "", "PRISM_LOG_PREFIX": "/a/b"})
    assert prefix.log_prefix == "a/b/"


def test_the_files_interval_is_a_setting_and_a_request_reaches_the_files_that_soon(
    origin_factory: OriginFactory, api_key: str, tmp_path: Path
) -> None:
    env = origin_env("redis://127.0.0.1:1/0", "http://127.0.0.1:1", PRISM_LOG_DIR="/tmp/x")
    for bad in ("0", "3601"):
        with pytest.raises(SettingsError, match=r"PRISM_LOG_FILES_INTERVAL must be 0\.1 to 3600"):
            Settings.from_env({**env, "PRISM_LOG_FILES_INTERVAL": bad})
    # Unset, the sink's own minute; set, a miss is on disk well within it.
    assert Settings.from_env(env).log_files_interval is None
    origin = origin_factory(PRISM_LOG_DIR=str(tmp_path), PRISM_LOG_FILES_INTERVAL="0.2")
    answer = httpx.post(
        origin.url + "/v1/chat/completions",
        json={"model": "demo", "messages": [{"role": "user", "content": "files soon"}]},
        headers={"authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    assert answer.status_code == 200
    [written] = wait_for(lambda: list(tmp_path.glob("day=*/project=acme/*.jsonl.gz")), 10)
    [line] = gzip.decompress(written.read_bytes()).splitlines()
    assert orjson.loads(line)["id"] == answer.headers["x-request-id"]
