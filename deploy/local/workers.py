"""Start and stop the local Workers runtime (``runtime.mjs``) from Python.

The runtime is the pinned Miniflare 3 / workerd (it embeds Pyodide, so Python
Workers run offline). One Node process runs the Prism edge, the Workers KV REST
API stand-in (``kv_api.js``) and any extra Workers, all bound to the same KV
namespace. ``LocalWorkersRuntime`` writes the launcher's config, spawns
``node runtime.mjs CONFIG`` in its own process group with a stdin pipe (the
launcher exits when that pipe closes, so it dies with us), waits for the one
JSON "ready" line on stdout and drains stderr into a bounded buffer that
failures quote.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from deploy.local.processes import die_with_us

__all__ = [
    "DEFAULT_API_TOKEN",
    "DEFAULT_WARMUP_PATH",
    "MINIFLARE_VERSION",
    "ExtraWorker",
    "LocalWorkersRuntime",
    "NodeToolchain",
    "PortInUseError",
    "RuntimeStartError",
    "ToolchainNotFoundError",
    "find_node_toolchain",
]

#: The pinned version: newer ones download Pyodide at start-up and fail offline.
MINIFLARE_VERSION = "3.20241106.1"
#: Bearer token the KV REST stand-in requires unless told otherwise.
DEFAULT_API_TOKEN = "prism-local-api-token"
#: GET sent to the edge before "ready": Python Workers import their modules on
#: the first request, so this makes start() pay the cold start and fail on
#: import errors instead of the first test request.
DEFAULT_WARMUP_PATH = "/__prism/warmup"

_RUNTIME_SCRIPT = Path(__file__).with_name("runtime.mjs")
_STDERR_LINES = 400


class ToolchainNotFoundError(RuntimeError):
    """``node`` or the pinned ``node_modules`` (``npm ci``) is missing."""


class RuntimeStartError(RuntimeError):
    """The runtime did not become ready; the message carries its stderr tail."""


class PortInUseError(RuntimeStartError):
    """A requested port was already taken."""


@dataclass(frozen=True)
class NodeToolchain:
    """Where ``node`` and the ``node_modules`` holding Miniflare are."""

    node: Path
    node_modules: Path
    miniflare_version: str


@dataclass(frozen=True)
class ExtraWorker:
    """Another Worker to run next to the edge (a ``.py`` or ``.js`` entry under ``root``)."""

    name: str
    root: Path
    entry: str = "entry.py"
    vars: Mapping[str, str] = field(default_factory=dict)
    port: int = 0
    kv_binding: str | None = None
    warmup_path: str | None = DEFAULT_WARMUP_PATH

    def to_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "root": str(Path(self.root).resolve()),
            "entry": self.entry,
            "vars": dict(self.vars),
            "port": self.port,
            "kv_binding": self.kv_binding,
            "warmup_path": self.warmup_path,
        }


def _candidate_dirs(start: Path) -> Iterable[Path]:
    start = start.resolve()
    yield start
    yield from start.parents


def find_node_toolchain(node_modules_dir: Path | None = None) -> NodeToolchain:
    """Locate ``node`` and the ``node_modules`` folder with the pinned Miniflare.

    Order: the ``node_modules_dir`` argument, ``$PRISM_NODE_MODULES``, then the
    nearest ``node_modules`` walking up from this file and from the current
    directory. ``$PRISM_NODE`` overrides the ``node`` found on ``PATH``.
    """
    node_env = os.environ.get("PRISM_NODE")
    node = node_env or shutil.which("node")
    if not node:
        raise ToolchainNotFoundError(
            "`node` was not found on PATH (Node 20 is needed for the local Workers runtime); "
            "install it or set PRISM_NODE"
        )
    candidates: list[Path] = []
    if node_modules_dir is not None:
        # An explicit folder is a requirement, not a hint: no silent fallback.
        candidates.append(Path(node_modules_dir))
    elif env_dir := os.environ.get("PRISM_NODE_MODULES"):
        candidates.append(Path(env_dir))
    if node_modules_dir is None:
        for start in (Path(__file__).parent, Path.cwd()):
            candidates.extend(d / "node_modules" for d in _candidate_dirs(start))
    for candidate in candidates:
        # Accept either a node_modules folder or the folder that contains one.
        for folder in (candidate, candidate / "node_modules"):
            package = folder / "miniflare" / "package.json"
            if package.is_file():
                version = str(json.loads(package.read_text()).get("version", "?"))
                return NodeToolchain(Path(node), folder.resolve(), version)
    raise ToolchainNotFoundError(
        "the pinned Workers runtime is not installed: no node_modules/miniflare found "
        f"(looked in {', '.join(str(c) for c in candidates[:4])}, ...). "
        "Run `npm ci` in the repository root (package.json pins "
        f"miniflare@{MINIFLARE_VERSION}), or set PRISM_NODE_MODULES."
    )


class LocalWorkersRuntime:
    """The local Workers runtime: the edge, the KV REST stand-in and extra Workers.

    Ports left at 0 are picked by the runtime itself (workerd binds port 0, so
    there is no window in which another process can take a pre-chosen port);
    the real URLs are known after :meth:`start`.
    """

    def __init__(
        self,
        *,
        edge_root: Path | None,
        edge_vars: Mapping[str, str],
        persist_dir: Path,
        host: str = "127.0.0.1",
        edge_port: int = 0,
        edge_entry: str = "entry.py",
        edge_warmup_path: str | None = DEFAULT_WARMUP_PATH,
        kv_binding: str = "PRISM_KV",
        kv_api: bool = True,
        kv_api_port: int = 0,
        extra_workers: Iterable[ExtraWorker] = (),
        account_id: str = "local",
        api_token: str = DEFAULT_API_TOKEN,
        kv_namespace_id: str = "prism-local",
        kv_namespace_title: str = "prism-cache",
        node_modules_dir: Path | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.edge_root = Path(edge_root) if edge_root is not None else None
        self.edge_vars = dict(edge_vars)
        self.persist_dir = Path(persist_dir)
        self.host = host
        self.edge_port = edge_port
        self.edge_entry = edge_entry
        self.edge_warmup_path = edge_warmup_path
        self.kv_binding = kv_binding
        self.kv_api = kv_api
        self.kv_api_port = kv_api_port
        self.extra_workers = tuple(extra_workers)
        self.account_id = account_id
        self.api_token = api_token
        self.kv_namespace_id = kv_namespace_id
        self.kv_namespace_title = kv_namespace_title
        self.node_modules_dir = node_modules_dir
        self.log_path = log_path

        self.edge_url: str | None = None
        self.kv_api_url: str | None = None
        self.extra_urls: dict[str, str] = {}
        self.startup_seconds: float | None = None
        #: What the launcher measured: ``runtime_ms`` (workerd + Pyodide boot) and
        #: ``warmup_ms`` per Worker (first request, i.e. module imports).
        self.timings: dict[str, Any] = {}
        self._proc: subprocess.Popen[str] | None = None
        self._config_dir: Path | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._stdout_lines: queue.Queue[str | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._log_file: IO[str] | None = None

    # ------------------------------------------------------------------ info

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """PID of the Node launcher, which also leads the process group workerd runs in."""
        return self._proc.pid if self._proc is not None else None

    @property
    def kv_control_url(self) -> str | None:
        """Base URL of the stand-in's test controls (``/_control/faults`` etc.)."""
        if self.kv_api_url is None:
            return None
        return self.kv_api_url.removesuffix("/client/v4") + "/_control"

    def stderr_tail(self, lines: int = 60) -> str:
        """The last ``lines`` lines the runtime wrote to stderr."""
        return "\n".join(list(self._stderr)[-lines:])

    def config(self, node_modules: Path | None = None) -> dict[str, Any]:
        """The JSON config handed to ``runtime.mjs``."""
        edge: dict[str, Any] | None = None
        if self.edge_root is not None:
            edge = {
                "port": self.edge_port,
                "root": str(self.edge_root.resolve()),
                "entry": self.edge_entry,
                "vars": self.edge_vars,
                "kv_binding": self.kv_binding,
                "warmup_path": self.edge_warmup_path,
            }
        kv_api: dict[str, Any] | None = None
        if self.kv_api:
            kv_api = {
                "port": self.kv_api_port,
                "account_id": self.account_id,
                "api_token": self.api_token,
            }
        return {
            "host": self.host,
            "edge": edge,
            "kv_api": kv_api,
            "extra_workers": [w.to_config() for w in self.extra_workers],
            "kv_namespace_id": self.kv_namespace_id,
            "kv_namespace_title": self.kv_namespace_title,
            "persist_dir": str(self.persist_dir.resolve()),
            "node_modules": str(node_modules) if node_modules is not None else None,
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> Self:
        """Spawn the runtime and block until every Worker is ready (or raise)."""
        if self._proc is not None:
            raise RuntimeError("runtime already started")
        toolchain = find_node_toolchain(self.node_modules_dir)
        self._stdout_lines = queue.Queue()
        self._stderr.clear()
        self.persist_dir.mkdir(parents=True, exist_ok=True)
        self._config_dir = Path(tempfile.mkdtemp(prefix="prism-workers-"))
        config_path = self._config_dir / "runtime.json"
        config_path.write_text(json.dumps(self.config(toolchain.node_modules)))
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = self.log_path.open("a", encoding="utf-8")

        env = {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"}
        began = time.monotonic()
        self._proc = subprocess.Popen(
            [str(toolchain.node), str(_RUNTIME_SCRIPT), str(config_path)],
            stdin=subprocess.PIPE,  # held open: its EOF tells the launcher we are gone
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            env=env,
            start_new_session=True,  # own process group: stop() can reap workerd too
            # SIGTERM when we die (Linux), besides stdin's EOF: either way it disposes workerd.
            preexec_fn=die_with_us(),
        )
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._spawn_reader(self._proc.stdout, self._on_stdout, self._stdout_lines)
        self._spawn_reader(self._proc.stderr, self._on_stderr, None)

        try:
            ready = self._await_ready(began + timeout, timeout, toolchain)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        self.edge_url = ready.get("edge")
        self.kv_api_url = ready.get("kv_api")
        self.extra_urls = dict(ready.get("extra") or {})
        self.timings = dict(ready.get("timings") or {})
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the launcher to dispose the runtime; kill the process group if it hangs."""
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=timeout)
            # workerd shares the group; reap anything a crashed launcher left behind.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            for thread in self._threads:
                thread.join(timeout=2)
        finally:
            self._proc = None
            self._threads = []
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            if self._config_dir is not None:
                shutil.rmtree(self._config_dir, ignore_errors=True)
                self._config_dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _await_ready(
        self, deadline: float, timeout: float, toolchain: NodeToolchain
    ) -> dict[str, Any]:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeStartError(
                    f"local Workers runtime not ready after {timeout:.0f}s\n"
                    f"--- runtime stderr (tail) ---\n{self.stderr_tail()}"
                )
            try:
                line = self._stdout_lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if line is None:  # stdout closed: the launcher exited before ready
                self._drain_after_exit()
                assert self._proc is not None
                raise RuntimeStartError(
                    f"local Workers runtime exited (code {self._proc.returncode}) before it "
                    f"was ready (miniflare {toolchain.miniflare_version} in "
                    f"{toolchain.node_modules})\n"
                    f"--- runtime stderr (tail) ---\n{self.stderr_tail()}"
                )
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                self._on_stderr(f"[stdout] {line}")
                continue
            if not isinstance(message, dict):
                continue
            if message.get("ready") is True:
                return message
            error = str(message.get("error", "unknown error"))
            self._drain_after_exit()
            cls = PortInUseError if "in use" in error else RuntimeStartError
            raise cls(
                f"local Workers runtime failed to start: {error}\n"
                f"--- runtime stderr (tail) ---\n{self.stderr_tail()}"
            )

    def _drain_after_exit(self) -> None:
        """After a failed start, wait for the launcher and its last stderr lines."""
        assert self._proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
        for thread in self._threads:
            thread.join(timeout=2)

    def _spawn_reader(
        self,
        stream: IO[str],
        on_line: Callable[[str], None],
        done: queue.Queue[str | None] | None,
    ) -> None:
        def pump() -> None:
            try:
                for raw in stream:
                    on_line(raw.rstrip("\n"))
            except ValueError:  # stream closed under us during stop()
                pass
            finally:
                if done is not None:
                    done.put(None)

        thread = threading.Thread(target=pump, name="prism-workers-io", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _on_stdout(self, line: str) -> None:
        self._stdout_lines.put(line)

    def _on_stderr(self, line: str) -> None:
        self._stderr.append(line)
        log_file = self._log_file  # stop() may close and clear it concurrently
        if log_file is not None:
            with contextlib.suppress(ValueError):
                log_file.write(line + "\n")
                log_file.flush()
