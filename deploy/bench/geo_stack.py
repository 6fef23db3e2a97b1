"""The stack of `prism bench geo`: every part on its own network namespace (or loopback),
with a delay proxy on each link the profile gives a distance.

Parts: the provider (its fixed latency), the Redis primary and a replica (the replication
link delayed), an origin per region, and one local Workers runtime as the PoP, running one
edge Worker per (customer, number of regions): each knows its origins through its own
proxies, so the PoP of Singapore and the PoP of San Francisco are distinct distances from
the same origins. The client reaches each Worker through a proxy of its own.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from deploy.edge_bundle import build_edge
from deploy.local import netns
from deploy.local.delay_proxy import DelayProxy
from deploy.local.ports import free_port
from deploy.local.processes import ChildProcess
from deploy.local.redis import RedisServer
from deploy.local.workers import ExtraWorker, LocalWorkersRuntime
from prism import parse_key_secrets

from .geo_profile import Customer, GeoProfile

__all__ = ["PARTS", "Edge", "GeoStack"]

PARTS = ("client", "pop", "redis", "replica", "provider")  # plus one per region
_PROJECT = "geo"
# The demo provider answers here: real providers' keys and another Redis stay out.
_NOT_INHERITED = frozenset(
    {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PRISM_PROVIDERS_FILE", "REDIS_URL",
     "PRISM_REDIS_READ_URL", "PRISM_KV_ACCOUNT_ID", "PRISM_KV_NAMESPACE_ID"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Edge:
    """One edge Worker at the PoP: a customer's view with one or two regions."""

    customer: Customer
    regions: tuple[str, ...]
    url: str  # through the client's delay proxy
    direct_url: str  # the Worker through a link of no delay (the floor)
    links: Mapping[str, str]  # region -> its origin through this PoP's link (the floor)

    @property
    def label(self) -> str:
        return f"{self.customer.name}, {len(self.regions)} region{'s' * (len(self.regions) > 1)}"


@dataclass
class GeoStack:
    profile: GeoProfile
    isolated: bool = True  # network namespaces; False: loopback
    state_dir: Path | None = None
    network: netns.Network | None = None
    edges: list[Edge] = field(default_factory=list)
    origins: dict[str, ChildProcess] = field(default_factory=dict)
    origin_urls: dict[str, str] = field(default_factory=dict)  # direct, for the floor
    reading_redis: dict[str, str] = field(default_factory=dict)  # region -> its lookups' Redis
    api_key: str = ""
    _proxies: list[DelayProxy] = field(default_factory=list)
    _servers: list[RedisServer] = field(default_factory=list)
    _processes: list[ChildProcess] = field(default_factory=list)
    _runtime: LocalWorkersRuntime | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def regions(self) -> tuple[str, ...]:
        return (self.profile.home, self.profile.second)

    def _proxy(self, host: str, port: int, rtt_ms: float) -> str:
        """A link of ``rtt_ms`` to ``host:port``; its ``host:port`` on the gateway."""
        assert self.network is not None
        proxy = DelayProxy(host, port, rtt_ms / 2000, host=self.network.gateway).start()
        self._proxies.append(proxy)
        return f"{proxy.host}:{proxy.port}"

    def start(self) -> GeoStack:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> GeoStack:
        profile, python = self.profile, sys.executable
        if self.state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="prism-geo-")
            self.state_dir = Path(self._tmp.name)
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        names = (*PARTS, *self.regions)
        self.network = net = netns.Network.create(names) if self.isolated else (
            netns.Network.loopback(names)
        )  # fmt: skip
        at = net.addresses
        key_secret, forward_secret = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self.api_key = parse_key_secrets(key_secret).mint(_PROJECT)

        with net.entered("provider"):
            port = free_port(at["provider"])
            provider = ChildProcess(
                "provider",
                [python, "-m", "deploy.local.provider", "--host", at["provider"],
                 "--port", str(port), "--latency-ms", str(profile.provider_latency_ms)],
                logs / "provider.log",
            )  # fmt: skip
            self._processes.append(provider)
            provider_url = f"http://{at['provider']}:{port}"
            provider.wait_http(provider_url + "/v1/models")

        with net.entered("redis"):
            primary = RedisServer(host=at["redis"], workdir=self.state_dir).start()
            self._servers.append(primary)
        # The replica follows the primary through the replication link's proxy.
        link_host, _, link_port = self._proxy(
            primary.host, primary.port, profile.replication_ms
        ).partition(":")
        with net.entered("replica"):
            replica = RedisServer(
                host=at["replica"],
                replica_of=RedisServer(port=int(link_port), host=link_host),
                workdir=self.state_dir,
            ).start()
            self._servers.append(replica)

        common = {
            **{k: v for k, v in os.environ.items() if k not in _NOT_INHERITED},
            "PRISM_KEY_SECRET": key_secret,
            "PRISM_FORWARD_SECRET": forward_secret,
            "OPENAI_BASE_URL": provider_url + "/v1",
            "OPENAI_API_KEY": "geo",
        }
        for region in self.regions:
            to_primary = self._proxy(primary.host, primary.port, profile.origin_primary_ms[region])
            env = {**common, "REDIS_URL": f"redis://{to_primary}/0"}
            self.reading_redis[region] = primary.url
            if region == profile.second:
                to_replica = self._proxy(replica.host, replica.port, profile.origin_replica_ms)
                env["PRISM_REDIS_READ_URL"] = f"redis://{to_replica}/0"
                self.reading_redis[region] = replica.url
            with net.entered(region):
                port, admin = free_port(at[region]), free_port(at[region])
                origin = ChildProcess(
                    f"origin-{region}",
                    [python, "-m", "deploy.cli", "origin", "serve", "--host", at[region],
                     "--port", str(port), "--admin-host", at[region], "--admin-port", str(admin),
                     "--workers", "1"],
                    logs / f"origin-{region}.log",
                    env,
                )  # fmt: skip
                self._processes.append(origin)
                self.origins[region] = origin
                self.origin_urls[region] = f"http://{at[region]}:{port}"
                origin.wait_http(f"http://{at[region]}:{admin}/healthz")

        # One edge Worker per (customer, regions), each with its own links to the origins.
        bundle = build_edge("local", self.state_dir / "edge")
        workers: list[tuple[Customer, tuple[str, ...], ExtraWorker, dict[str, str]]] = []
        for customer in profile.customers:
            for regions in ((profile.home,), self.regions):
                links = {
                    region: "http://"
                    + self._proxy(
                        at[region],
                        int(self.origin_urls[region].rsplit(":", 1)[1]),
                        customer.pop_origin_ms[region],
                    )
                    for region in regions
                }
                binding = {
                    "PRISM_KEY_SECRET": key_secret,
                    "PRISM_FORWARD_SECRET": forward_secret,
                    "PRISM_ORIGINS": ",".join(f"{r}={url}" for r, url in links.items()),
                    "PRISM_ORIGIN_TIMEOUT_MS": "30000",
                }
                name = f"{customer.key}{len(regions)}"
                worker = ExtraWorker(name, bundle.root, vars=binding, kv_binding="PRISM_KV")
                workers.append((customer, regions, worker, links))
        with net.entered("pop"):
            self._runtime = LocalWorkersRuntime(
                edge_root=None,
                edge_vars={},
                persist_dir=self.state_dir / "kv",
                host=at["pop"],
                kv_api=False,
                extra_workers=[worker for _, _, worker, _ in workers],
                log_path=logs / "workers.log",
            ).start(timeout=120)
        for customer, regions, worker, links in workers:
            port = int(self._runtime.extra_urls[worker.name].rsplit(":", 1)[1])
            link = self._proxy(at["pop"], port, customer.client_pop_ms)
            direct = self._proxy(at["pop"], port, 0)  # the proxy's own cost, no distance
            self.edges.append(Edge(customer, regions, f"http://{link}", f"http://{direct}", links))
        return self

    def edge(self, customer: Customer, regions: int) -> Edge:
        return next(e for e in self.edges if e.customer == customer and len(e.regions) == regions)

    def kill_origin(self, region: str) -> None:
        """The origin of ``region`` stops, as a crashed machine would (its links stay)."""
        self.origins[region].stop(timeout=2)

    @contextlib.contextmanager
    def as_client(self) -> Iterator[None]:
        """This thread where the customers are (their namespace)."""
        assert self.network is not None
        with self.network.entered("client"):
            yield

    def stop(self) -> None:
        if self._runtime is not None:
            self._runtime.stop()
            self._runtime = None
        for process in reversed(self._processes):
            process.stop(timeout=5)
        self._processes.clear()
        for server in reversed(self._servers):
            server.stop()
        self._servers.clear()
        for proxy in self._proxies:
            proxy.stop()
        self._proxies.clear()
        if self.network is not None:
            self.network.stop()
            self.network = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
