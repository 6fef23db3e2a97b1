"""The whole Prism stack on loopback: Redis, the demo provider (or real ones), the
origin, and the edge Worker with the KV REST stand-in in the local Workers runtime.

Used by `prism dev` and the benchmark. Every part runs as a child process in its
own process group, so `stop()` (and Ctrl-C) leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import redis

from deploy.edge_bundle import build_edge
from deploy.local.origin_watch import OriginState, OriginWatch
from deploy.local.ports import free_port, port_is_free
from deploy.local.processes import ChildProcess, ChildStartError
from deploy.local.redis import RedisServer
from deploy.local.workers import ExtraWorker, LocalWorkersRuntime
from prism import parse_key_secrets

__all__ = [
    "REQUEST_LOG_DIR",
    "Component",
    "LocalStack",
    "StackConfig",
    "StackError",
    "StackInfo",
    "dev_api_key",
]

DEMO_LABEL = "demo (local)"
_DEV_PROJECT, _DEV_KEY_ID = "dev", "devkey0000000001"
_SECRETS_FILE = "dev-secrets.json"
# The origin's durable request log (PRISM_LOG_DIR), under the state directory.
REQUEST_LOG_DIR = "logs/requests"
_DEV_FILES_INTERVAL = "5"  # seconds between its batches (an origin's default: a minute)
# The local regions' names (only names here: every part runs on loopback).
REGIONS = ("us-west-1", "ap-south-1")
_PROVIDER_ENV = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PRISM_PROVIDERS_FILE")


class StackError(RuntimeError):
    """Something stopped the stack from starting, said in one line."""


@dataclass(frozen=True, slots=True)
class StackConfig:
    state_dir: Path = Path(".prism")
    host: str = "127.0.0.1"
    origin_port: int = 8080
    origin_admin_port: int = 0  # the origin's /healthz in detail and /metrics; 0 = any free
    edge_port: int = 8787
    kv_api_port: int = 8788
    provider_port: int = 0  # the demo provider; 0 = any free port
    redis_url: str | None = None  # None: start a private redis-server
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    kv_flush_interval: float = 0.1
    # For the benchmark: more Workers in the same runtime, extra origin environment,
    # and extra demo-provider flags (e.g. ``--reply-words``).
    extra_workers: Sequence[ExtraWorker] = ()
    origin_env: Mapping[str, str] = field(default_factory=dict)
    provider_args: Sequence[str] = ()
    edge_env: Mapping[str, str] = field(default_factory=dict)  # more edge bindings
    # 2: a second origin in another region, reading a replica of the private Redis (a
    # REDIS_URL is shared as it is), and the edge knowing both (PRISM_ORIGINS).
    regions: int = 1


@dataclass(frozen=True, slots=True)
class Component:
    name: str
    url: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class StackInfo:
    edge_url: str
    origin_url: str
    origin_admin_url: str  # /healthz in detail and /metrics (never on origin_url)
    kv_api_url: str
    redis_url: str
    provider: str
    project: str
    api_key: str
    components: tuple[Component, ...]
    regions: Mapping[str, str] = field(default_factory=dict)  # region -> origin, if several

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _dev_secrets(state_dir: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Secrets from the environment, else generated once and kept in the state folder."""
    path = state_dir / _SECRETS_FILE
    stored: dict[str, str] = {}
    if path.exists():
        with contextlib.suppress(ValueError, OSError):
            stored = json.loads(path.read_text())
    wanted = (
        "PRISM_KEY_SECRET",
        "PRISM_FORWARD_SECRET",
        "PRISM_LOCAL_API_TOKEN",
        "PRISM_ADMIN_KEY",
    )
    values = {
        name: env.get(name) or stored.get(name) or secrets.token_urlsafe(32) for name in wanted
    }
    if values != stored:
        path.write_text(json.dumps(values))
        path.chmod(0o600)
    return values


def _mint_dev_key(key_secret: str) -> str:
    return parse_key_secrets(key_secret).mint(_DEV_PROJECT, key_id=_DEV_KEY_ID)


def dev_api_key(state_dir: Path) -> str | None:
    """The dev key of the `prism dev` stack kept in ``state_dir`` (it is derived from the
    stack's key secret, so it is not stored), or None when there is none."""
    try:
        stored = json.loads((state_dir / _SECRETS_FILE).read_text())
        return _mint_dev_key(str(stored["PRISM_KEY_SECRET"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _check_redis(url: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except (redis.RedisError, OSError, ValueError) as error:
        shown = url.split("@")[-1]  # never print a password
        raise StackError(f"cannot reach Redis at {shown}: {type(error).__name__}") from None
    finally:
        client.close()


class LocalStack:
    def __init__(self, config: StackConfig, on_ready: Callable[[Component], None] | None = None):
        self.config = config
        self._on_ready = on_ready or (lambda component: None)
        self._redis: RedisServer | None = None
        self._replica: RedisServer | None = None
        self._runtime: LocalWorkersRuntime | None = None
        self._processes: list[ChildProcess] = []
        # The origins, restarted when they exit (the rest of the stack serves on).
        self.origins = OriginWatch()
        self.info: StackInfo | None = None

    def _ready(self, components: list[Component], name: str, url: str, detail: str) -> None:
        components.append(Component(name, url, detail))
        self._on_ready(components[-1])

    def _wait_http(self, process: ChildProcess, url: str, timeout: float) -> None:
        try:
            process.wait_http(url, timeout=timeout)
        except ChildStartError as error:
            raise StackError(str(error)) from None

    def _replica_of_primary(self, state: Path, components: list[Component]) -> str | None:
        """A replica of the private Redis for the second region's reads (None: none)."""
        if self._redis is None:
            return None
        (state / "redis-replica").mkdir(exist_ok=True)
        try:
            self._replica = RedisServer(
                host=self.config.host, workdir=state / "redis-replica", replica_of=self._redis
            ).start()
        except (FileNotFoundError, RuntimeError, TimeoutError) as error:
            raise StackError(f"cannot start the Redis replica: {error}") from None
        self._ready(components, "replica", self._replica.url, f"replica of {self._redis.url}")
        return self._replica.url

    def start(self) -> StackInfo:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> StackInfo:
        cfg = self.config
        if cfg.regions not in (1, 2):
            raise StackError(f"--regions must be 1 or 2, got {cfg.regions}")
        state = cfg.state_dir.resolve()
        logs = state / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for label, port in (
            ("origin", cfg.origin_port),
            ("edge", cfg.edge_port),
            ("KV API stand-in", cfg.kv_api_port),
        ):
            if port and not port_is_free(cfg.host, port):
                raise StackError(f"port {port} ({label}) is in use on {cfg.host}; choose another")
        components: list[Component] = []
        dev = _dev_secrets(state, cfg.env)
        python = sys.executable

        # Redis: the configured one, else a private server (the system's or the embedded one).
        redis_url = cfg.redis_url or cfg.env.get("REDIS_URL")
        if redis_url:
            _check_redis(redis_url)
            self._ready(components, "redis", redis_url.split("@")[-1], "configured (REDIS_URL)")
        else:
            (state / "redis").mkdir(exist_ok=True)
            try:
                self._redis = RedisServer(host=cfg.host, workdir=state / "redis").start()
            except (FileNotFoundError, RuntimeError, TimeoutError) as error:
                raise StackError(f"cannot start Redis: {error}") from None
            redis_url = self._redis.url
            self._ready(components, "redis", redis_url, "private redis-server")

        # Providers: real ones from the environment, else the local demo provider.
        origin_env = {
            **cfg.env,
            "PRISM_KEY_SECRET": dev["PRISM_KEY_SECRET"],
            "PRISM_FORWARD_SECRET": dev["PRISM_FORWARD_SECRET"],
            "PRISM_ADMIN_KEY": dev["PRISM_ADMIN_KEY"],  # the dashboard on the admin listener
            "REDIS_URL": redis_url,
        }
        if not (cfg.env.get("PRISM_LOG_DIR") or cfg.env.get("PRISM_LOG_BUCKET")):
            # The request log's durable history, for `prism logs query`: a batch every few
            # seconds, so a request tried by hand is soon there (a local log is small).
            origin_env["PRISM_LOG_DIR"] = str(state / REQUEST_LOG_DIR)
            origin_env.setdefault("PRISM_LOG_FILES_INTERVAL", _DEV_FILES_INTERVAL)
        if any(cfg.env.get(name) for name in _PROVIDER_ENV):
            provider = "configured (" + ", ".join(n for n in _PROVIDER_ENV if cfg.env.get(n)) + ")"
        else:
            port = cfg.provider_port or free_port(cfg.host)
            demo = ChildProcess(
                "provider",
                [
                    python,
                    "-m",
                    "deploy.local.provider",
                    "--host",
                    cfg.host,
                    "--port",
                    str(port),
                    *cfg.provider_args,
                ],
                logs / "provider.log",
                cfg.env,
            )
            self._processes.append(demo)
            demo_url = f"http://{cfg.host}:{port}"
            self._wait_http(demo, demo_url + "/v1/models", 30)
            origin_env.update(
                OPENAI_BASE_URL=demo_url + "/v1",
                OPENAI_API_KEY="demo",
                PRISM_OPENAI_LABEL=DEMO_LABEL,
            )
            provider = DEMO_LABEL
            self._ready(components, "provider", demo_url, "local demo provider (no real model)")

        # The origin, told where the KV stand-in will be.
        kv_port = cfg.kv_api_port or free_port(cfg.host)
        kv_api_url = f"http://{cfg.host}:{kv_port}/client/v4"
        origin_url = f"http://{cfg.host}:{cfg.origin_port}"
        admin_port = cfg.origin_admin_port or free_port(cfg.host)
        origin_admin_url = f"http://{cfg.host}:{admin_port}"
        origin_env.update(
            PRISM_KV_API_URL=kv_api_url,
            PRISM_KV_ACCOUNT_ID="local",
            PRISM_KV_NAMESPACE_ID="prism-local",
            CLOUDFLARE_API_TOKEN=dev["PRISM_LOCAL_API_TOKEN"],
            PRISM_KV_FLUSH_INTERVAL=str(cfg.kv_flush_interval),
        )
        origin_env.update(cfg.origin_env)
        origin = self._origin("origin", REGIONS[0], cfg.origin_port, admin_port, origin_env, logs)
        regions: dict[str, str] = {}
        second: tuple[ChildProcess, str] | None = None
        if cfg.regions == 2:
            # Its own ports next to the first's when free, else any free ones.
            port = cfg.origin_port + 1 if cfg.origin_port else 0
            if not port or not port_is_free(cfg.host, port):
                port = free_port(cfg.host)
            read_url = self._replica_of_primary(state, components)
            env = {**origin_env, **({"PRISM_REDIS_READ_URL": read_url} if read_url else {})}
            second_admin = free_port(cfg.host)
            name = f"origin-{REGIONS[1]}"
            second = (
                self._origin(name, REGIONS[1], port, second_admin, env, logs),
                f"http://{cfg.host}:{second_admin}",
            )
            regions = {REGIONS[0]: origin_url, REGIONS[1]: f"http://{cfg.host}:{port}"}

        # The edge Worker and the KV stand-in, in the local Workers runtime.
        bundle = build_edge("local", state / "edge", origin_url=origin_url)
        self._runtime = LocalWorkersRuntime(
            edge_root=bundle.root,
            edge_vars={
                "PRISM_KEY_SECRET": dev["PRISM_KEY_SECRET"],
                "PRISM_FORWARD_SECRET": dev["PRISM_FORWARD_SECRET"],
                "ORIGIN_URL": origin_url,
                **({"PRISM_ORIGINS": _origins_binding(regions)} if regions else {}),
                **cfg.edge_env,
            },
            persist_dir=state / "kv",
            host=cfg.host,
            edge_port=cfg.edge_port,
            kv_api_port=kv_port,
            api_token=dev["PRISM_LOCAL_API_TOKEN"],
            extra_workers=cfg.extra_workers,
            log_path=logs / "workers.log",
        )
        try:
            self._runtime.start()
        except RuntimeError as error:
            raise StackError(
                f"the local Workers runtime failed: {str(error).splitlines()[0]}"
            ) from None
        assert self._runtime.edge_url is not None
        self._wait_http(origin, origin_admin_url + "/healthz", 30)
        self._ready(components, "origin", origin_url, f"providers: {provider}")
        self._ready(
            components, "admin", origin_admin_url, "origin /healthz, /metrics and /dashboard"
        )
        if second is not None:
            process, admin = second
            self._wait_http(process, admin + "/healthz", 30)
            reads = "reads the Redis replica" if self._replica else "shares REDIS_URL"
            self._ready(components, process.name, regions[REGIONS[1]], reads)
        self._ready(components, "kv-api", kv_api_url, "Workers KV REST stand-in")
        edge_url = self._runtime.edge_url
        self._ready(components, "edge", edge_url, "Python Worker (local runtime)")

        api_key = _mint_dev_key(dev["PRISM_KEY_SECRET"])
        self.info = StackInfo(
            edge_url=self._runtime.edge_url,
            origin_url=origin_url,
            origin_admin_url=origin_admin_url,
            kv_api_url=kv_api_url,
            redis_url=redis_url,
            provider=provider,
            project=_DEV_PROJECT,
            api_key=api_key,
            components=tuple(components),
            regions=regions,
        )
        (state / "dev.json").write_text(
            json.dumps({k: v for k, v in self.info.to_dict().items() if k != "api_key"})
        )
        return self.info

    def _origin(
        self,
        name: str,
        region: str,
        port: int,
        admin_port: int,
        env: Mapping[str, str],
        logs: Path,
    ) -> ChildProcess:
        cfg = self.config
        return self.origins.add(
            name,
            region,
            f"http://{cfg.host}:{port}",
            [sys.executable, "-m", "deploy.cli", "origin", "serve", "--host", cfg.host,
             "--port", str(port), "--admin-host", cfg.host, "--admin-port", str(admin_port),
             "--workers", "1"],
            logs / f"{name}.log",
            env,
        )  # fmt: skip

    @property
    def extra_urls(self) -> dict[str, str]:
        """URLs of ``StackConfig.extra_workers`` by name, once started."""
        return dict(self._runtime.extra_urls) if self._runtime is not None else {}

    def pid(self, name: str) -> int | None:
        """PID of a running part ("provider", "origin", "workers runtime"), if started."""
        if name == "workers runtime":
            return self._runtime.pid if self._runtime is not None else None
        processes = [*self._processes, *(origin.process for origin in self.origins.origins)]
        return next((p.pid for p in processes if p.name == name), None)

    def regions_up(self) -> dict[str, OriginState]:
        """Each region's origin: up, stopped, or restarting (after it exited)."""
        return self.origins.states()

    def dead_component(self) -> str | None:
        """The name of a part that has exited on its own, if any (an origin too, until
        ``origins.check()`` restarts it)."""
        for origin in self.origins.origins:
            if not origin.process.alive():
                return origin.name
        return self.fatal_component()

    def fatal_component(self) -> str | None:
        """A part that has exited and is not restarted (anything but an origin)."""
        for process in self._processes:
            if not process.alive():
                return process.name
        if self._runtime is not None and not self._runtime.running:
            return "workers runtime"
        if self._redis is not None and not self._redis.running:
            return "redis"
        if self._replica is not None and not self._replica.running:
            return "redis replica"
        return None

    def stop(self) -> None:
        # The origin first: its KV writer drains into the stand-in the runtime hosts.
        self.origins.stop()
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()
        if self._runtime is not None:
            self._runtime.stop()
            self._runtime = None
        if self._replica is not None:
            self._replica.stop()
            self._replica = None
        if self._redis is not None:
            self._redis.stop()
            self._redis = None


def _origins_binding(regions: Mapping[str, str]) -> str:
    """The edge's ``PRISM_ORIGINS`` for ``{region: origin url}``."""
    return ",".join(f"{region}={url}" for region, url in regions.items())
