"""The request log's sinks as servers a benchmark can kill: S3 and an OpenTelemetry collector.

- ``KillableChild``: a child process on a fixed port, SIGKILLed and started again on it.
- ``s3_server``: moto's S3 (``python -m moto.server``), reached by boto3 as AWS_ENDPOINT_URL_S3.
  It keeps its objects in memory, so ``S3Records`` reads what it holds before a kill and
  again at the end: the records found are the union, by request id.
- ``collector``: Rotel (PyPI ``rotel``, a real collector) receiving OTLP/HTTP and exporting
  over OTLP/HTTP to ``LogsReceiver``, an ASGI app in the bench's own process that decodes
  each export with ``opentelemetry-proto`` and keeps the request ids of the log records.
  The receiver lives through the collector's kill; what the collector had accepted but not
  yet exported dies with it (its batch waits 50 ms).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from starlette.types import Receive, Scope, Send

from deploy.local.processes import ChildProcess

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "ID_ATTRIBUTE",
    "KillableChild",
    "LogsReceiver",
    "S3Records",
    "collector",
    "read_otlp_body",
    "s3_client",
    "s3_server",
]

ID_ATTRIBUTE = "prism.request.id"  # the OTLP log record's attribute (origin/requestlog/otlp.py)
AWS_ENV = {  # dummy credentials: moto takes any, and nothing may reach real AWS
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


async def read_otlp_body(scope: Scope, receive: Receive) -> bytes:
    """An OTLP/HTTP export's whole body, gunzipped when the exporter compressed it."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    if headers.get("content-encoding") == "gzip":
        body = gzip.decompress(body)
    return body


class KillableChild:
    """``args`` as a child process, killed with SIGKILL and started again with the same
    arguments (so on the same ports)."""

    def __init__(
        self, name: str, args: list[str], logs: Path, env: Mapping[str, str], ready_url: str
    ) -> None:
        self.name, self._args, self._logs, self._env = name, args, logs, env
        self._ready_url = ready_url
        self._child: ChildProcess | None = None
        self.starts = 0

    def start(self) -> None:
        """Started, and answering HTTP (any status below 500)."""
        self._child = ChildProcess(
            self.name, self._args, self._logs / f"{self.name}.log", self._env
        )
        self.starts += 1
        self._child.wait_http(self._ready_url, timeout=30)

    def kill(self) -> None:
        """SIGKILL its whole group: no goodbye, as a crashed server."""
        child = self._child
        if child is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.popen.wait()
        child.stop()  # closes its log
        self._child = None

    def stop(self) -> None:
        if self._child is not None:
            self._child.stop()
            self._child = None


def s3_server(port: int, logs: Path) -> KillableChild:
    args = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    env = dict(os.environ) | AWS_ENV
    return KillableChild("s3", args, logs, env, f"http://127.0.0.1:{port}/")


def s3_client(url: str) -> S3Client:
    import boto3

    session = boto3.Session(
        aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        region_name=AWS_ENV["AWS_REGION"],
    )
    return session.client("s3", endpoint_url=url)


class S3Records:
    """The request ids found in a bucket's request-log files, over restarts of a server
    that forgets them: each ``read`` adds what the bucket holds now."""

    def __init__(self, client: S3Client, bucket: str, prefix: str) -> None:
        self._client, self._bucket, self._prefix = client, bucket, prefix
        self._read: set[str] = set()  # object keys already read (a name is its content's)
        self.ids: set[str] = set()
        self.objects = 0

    def create_bucket(self) -> None:
        self._client.create_bucket(Bucket=self._bucket)

    def read(self) -> int:
        """Read the objects not read before; the ids found so far."""
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self._bucket, Prefix=self._prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                key = item.get("Key", "")
                if key in self._read or not key.endswith(".jsonl.gz"):
                    continue
                body = self._client.get_object(Bucket=self._bucket, Key=key)["Body"].read()
                for line in gzip.decompress(body).splitlines():
                    self.ids.add(orjson.loads(line)["id"])
                self._read.add(key)
                self.objects += 1
        return len(self.ids)


def _rotel_binary() -> Path:
    import rotel  # the package ships the collector's binary beside its module

    binary = Path(rotel.__file__).parent / "rotel-agent"
    if not binary.exists():
        raise RuntimeError(f"the rotel package has no collector binary at {binary}")
    return binary


def collector(http_port: int, grpc_port: int, receiver_url: str, logs: Path) -> KillableChild:
    args = [
        str(_rotel_binary()), "start",
        "--otlp-http-endpoint", f"127.0.0.1:{http_port}",
        "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}",
        "--pid-file", str(logs / "rotel.pid"),
        "--log-file", str(logs / "rotel-agent.log"),
        "--exporter", "otlp",
        "--otlp-exporter-endpoint", receiver_url,
        "--otlp-exporter-protocol", "http",
        "--batch-timeout", "50ms",
    ]  # fmt: skip
    return KillableChild("collector", args, logs, dict(os.environ), f"http://127.0.0.1:{http_port}")


class LogsReceiver:
    """OTLP/HTTP (protobuf) on /v1/logs, keeping each log record's request id; /v1/traces
    and /v1/metrics are taken and dropped (the origin exports those too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()
        self.exports = 0  # /v1/logs requests received
        self.records = 0  # log records received (duplicates included)

    def ids(self) -> set[str]:
        with self._lock:
            return set(self._ids)

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.exports, len(self._ids)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_otlp_body(scope, receive)
        if scope["path"] == "/v1/logs":
            self._logs(body)
        known = scope["path"] in ("/v1/traces", "/v1/metrics", "/v1/logs")
        await send(
            {
                "type": "http.response.start",
                "status": 200 if known else 404,
                "headers": [(b"content-type", b"application/x-protobuf")],
            }
        )
        await send({"type": "http.response.body", "body": b""})  # an empty Export*Response

    def _logs(self, body: bytes) -> None:
        found: list[str] = []
        request = ExportLogsServiceRequest.FromString(body)
        for resource_logs in request.resource_logs:
            for scope_logs in resource_logs.scope_logs:
                for log in scope_logs.log_records:
                    found.extend(
                        pair.value.string_value
                        for pair in log.attributes
                        if pair.key == ID_ATTRIBUTE
                    )
        with self._lock:
            self.exports += 1
            self.records += len(found)
            self._ids.update(found)
