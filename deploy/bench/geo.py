"""`prism bench geo`: the three requests (miss, Redis hit, KV hit) of a customer far from
the origin, with one region and with two, over distances from a profile.

For each customer and each edge (one region, two), ``requests`` new bodies are each sent
three times: a miss (the provider), a Redis hit once the entry is in the Redis that
origin reads, and a KV hit once the edge has it in KV. The same entry is then asked
straight at the PoP's Worker and straight at the origin, with no distance: those floors
are what the machine itself costs, and the checks allow them on top of the distances.
Then the nearer origin of San Francisco is killed mid-run and the failures counted.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from prism import headers as h

from .geo_profile import DEFAULT_PROFILE, Customer, GeoProfile
from .geo_stack import Edge, GeoStack

__all__ = ["GeoConfig", "Row", "run_geo"]

CHAT = "/v1/chat/completions"
_ENTRIES = "prism:v*"  # the entries' keys in Redis
KV_SLACK_MS, REDIS_SLACK_MS = 5.0, 10.0


@dataclass(frozen=True, slots=True)
class GeoConfig:
    profile: GeoProfile = DEFAULT_PROFILE
    requests: int = 10  # bodies per edge
    failover_requests: int = 10  # misses at San Francisco's edge, its near origin killed halfway
    isolated: bool = True  # network namespaces (root); else loopback


@dataclass
class Row:
    customer: Customer
    regions: int
    ms: dict[str, list[float]] = field(default_factory=lambda: {"miss": [], "redis": [], "kv": []})
    # The KV hit at the Worker through a link of no delay (the proxy's and the edge's cost).
    floor_edge: list[float] = field(default_factory=list)
    # In a Redis hit, how long the edge waited for the origin (its Server-Timing stage).
    origin_wait: list[float] = field(default_factory=list)
    # The Redis hit straight at the origin, through the PoP's link to it (one round trip).
    floor_origin: list[float] = field(default_factory=list)
    answered_by: set[str] = field(default_factory=set)
    wrong_layers: list[str] = field(default_factory=list)
    redis_server_timing: str = ""  # one Redis hit's stages, edge and origin, for reading

    def median(self, layer: str) -> float:
        values = self.ms[layer] if layer in self.ms else getattr(self, layer)
        return round(statistics.median(values), 1) if values else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "customer": self.customer.name,
            "regions": self.regions,
            "answered_by": sorted(self.answered_by),
            **{f"{layer}_ms": self.median(layer) for layer in self.ms},
            "floor_edge_ms": self.median("floor_edge"),
            "floor_origin_ms": self.median("floor_origin"),
            "origin_wait_ms": self.median("origin_wait"),
            "samples": {layer: len(values) for layer, values in self.ms.items()},
            "wrong_layers": self.wrong_layers,
            "redis_server_timing": self.redis_server_timing,
        }


def _body() -> dict[str, Any]:
    return {
        "model": "demo",
        "temperature": 0,
        "messages": [{"role": "user", "content": f"geo {secrets.token_hex(8)}"}],
    }


class _Client:
    """The customer: one keep-alive client, its PoP's location on every request."""

    def __init__(self, api_key: str) -> None:
        self.http = httpx.Client(headers={"authorization": f"Bearer {api_key}"}, timeout=60)

    def ask(
        self, url: str, body: Mapping[str, Any], cf: Mapping[str, str]
    ) -> tuple[httpx.Response, float]:
        # The local Workers runtime takes request.cf from this header (Cloudflare sets it).
        started = time.perf_counter()
        response = self.http.post(
            url + CHAT, json=body, headers={"mf-cf-blob": json.dumps(dict(cf))}
        )
        return response, (time.perf_counter() - started) * 1000


_ORIGIN_STAGE = re.compile(r'(?:^|,)\s*origin;desc="[^"]*";dur=([0-9.]+)')


def _origin_wait(server_timing: str) -> float | None:
    """The edge's ``origin`` stage: from sending to the origin to its answer."""
    found = _ORIGIN_STAGE.search(server_timing)
    return float(found.group(1)) if found else None


def _grew(reader: redis.Redis, count: int) -> bool:
    return len(reader.keys(_ENTRIES)) > count


def _until(check: Callable[[], bool], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _measure(stack: GeoStack, client: _Client, edge: Edge, requests: int) -> Row:
    row = Row(edge.customer, len(edge.regions))
    cf = edge.customer.cf
    readers = {region: redis.Redis.from_url(url) for region, url in stack.reading_redis.items()}
    try:
        for _ in range(requests):
            body = _body()
            before = {region: len(r.keys(_ENTRIES)) for region, r in readers.items()}
            response, ms = client.ask(edge.url, body, cf)
            region = response.headers.get(h.ORIGIN_REGION, "?")
            row.answered_by.add(region)
            layer = response.headers.get(h.CACHE_LAYER, "-")
            if response.status_code != 200 or layer != "miss":
                row.wrong_layers.append(f"first: {response.status_code} {layer}")
                continue
            row.ms["miss"].append(ms)
            # The entry reaches the Redis this origin reads (the replica: after replication).
            _until(functools.partial(_grew, readers[region], before[region]))
            response, ms = client.ask(edge.url, body, cf)
            layer = response.headers.get(h.CACHE_LAYER, "-")
            if layer == "redis":
                row.ms["redis"].append(ms)
                row.redis_server_timing = response.headers.get(h.SERVER_TIMING, "")
                waited = _origin_wait(row.redis_server_timing)
                if waited is not None:
                    row.origin_wait.append(waited)
            else:
                row.wrong_layers.append(f"second: {response.status_code} {layer}")
            # The edge writes the entry to KV after answering from Redis.
            for _ in range(50):
                response, ms = client.ask(edge.url, body, cf)
                if response.headers.get(h.CACHE_LAYER) == "kv":
                    row.ms["kv"].append(ms)
                    break
            else:
                row.wrong_layers.append("third: never kv")
                continue
            response, ms = client.ask(edge.direct_url, body, cf)
            if response.headers.get(h.CACHE_LAYER) == "kv":
                row.floor_edge.append(ms)
            response, ms = client.ask(edge.links[region], body, cf)
            if response.headers.get(h.CACHE_LAYER) == "redis":
                row.floor_origin.append(ms)
    finally:
        for reader in readers.values():
            reader.close()
    return row


def _failover(stack: GeoStack, client: _Client, edge: Edge, requests: int) -> dict[str, Any]:
    """Misses at ``edge`` (two regions), its nearest origin killed halfway."""
    near = edge.customer
    nearest = min(edge.regions, key=lambda region: near.pop_origin_ms[region])
    failures, failed_attempts, answered_after = 0, 0, set()
    for number in range(requests):
        if number == requests // 2:
            stack.kill_origin(nearest)
        try:
            response, _ = client.ask(edge.url, _body(), near.cf)
        except httpx.HTTPError:
            failures += 1
            continue
        if response.status_code != 200:
            failures += 1
        failed_attempts += response.headers.get(h.SERVER_TIMING, "").count("origin-error")
        if number >= requests // 2:
            answered_after.add(response.headers.get(h.ORIGIN_REGION, "?"))
    return {
        "edge": f"{near.name}, {len(edge.regions)} regions",
        "killed": nearest,
        "requests": requests,
        "failures": failures,
        "failed_attempts": failed_attempts,
        "answered_after_kill": sorted(answered_after),
    }


def _checks(
    profile: GeoProfile, rows: list[Row], failover: Mapping[str, Any]
) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"check": name, "ok": bool(ok), "detail": detail})

    for row in rows:
        c, where = row.customer.client_pop_ms, f"{row.customer.name}, {row.regions} region(s)"
        edge_floor, origin_floor = row.median("floor_edge"), row.median("floor_origin")
        kv, hit = row.median("kv"), row.median("redis")
        check(
            f"{where}: KV hit ≤ client-PoP RTT + {KV_SLACK_MS:.0f} ms (+ the edge's floor)",
            kv <= c + KV_SLACK_MS + edge_floor,
            f"{kv} ms ≤ {c:g} + {KV_SLACK_MS:g} + {edge_floor} (the same hit through a link of "
            f"no delay; raw bound {c + KV_SLACK_MS:g})",
        )
        regions = sorted(row.answered_by)
        far = max((row.customer.pop_origin_ms.get(r, 0.0) for r in regions), default=0.0)
        # The same Redis hit asked of the origin straight through the PoP's link is one
        # PoP-origin round trip and the origin's own work: the edge may wait no longer.
        waited = row.median("origin_wait")
        check(
            f"{where}: Redis hit pays one PoP-origin RTT (+ {REDIS_SLACK_MS:.0f} ms)",
            waited <= origin_floor + REDIS_SLACK_MS,
            f"the edge waited {waited} ms for the origin ≤ {origin_floor} (the same request "
            f"straight through the {far:g} ms link) + {REDIS_SLACK_MS:g}; whole request {hit} ms "
            f"(raw bound {c + far + REDIS_SLACK_MS:g}; two round trips would be {c + 2 * far:g})",
        )
        check(f"{where}: every request on its layer", not row.wrong_layers,
              "; ".join(row.wrong_layers) or "miss, redis, kv")  # fmt: skip
    by = {(row.customer.key, row.regions): row for row in rows}
    for customer in profile.customers:
        one, two = by.get((customer.key, 1)), by.get((customer.key, 2))
        if one is None or two is None:
            continue
        nearest = min(customer.pop_origin_ms, key=lambda r: customer.pop_origin_ms[r])
        if nearest == profile.home:
            continue
        saved = one.median("miss") - two.median("miss")
        difference = customer.pop_origin_ms[profile.home] - customer.pop_origin_ms[nearest]
        check(
            f"{customer.name}, 2 regions: a miss pays the {nearest} RTT, not {profile.home}'s",
            two.answered_by == {nearest} and saved >= difference / 2,
            f"answered by {', '.join(sorted(two.answered_by))}; {saved:.1f} ms saved "
            f"(RTT difference {difference:g} ms)",
        )
    check(
        f"{failover['edge']}: {failover['killed']} killed mid-run, no request fails",
        failover["failures"] == 0 and failover["failed_attempts"] <= 1,
        f"{failover['failures']} failures of {failover['requests']}; "
        f"{failover['failed_attempts']} failed attempt(s) before the edge avoided it; "
        f"answered by {', '.join(failover['answered_after_kill'])} after",
    )
    return checks


def run_geo(
    config: GeoConfig, on_step: Callable[[str], None] = lambda step: None
) -> dict[str, Any]:
    """Start the stack, measure, check; the result as a JSON-able dict."""
    stack = GeoStack(config.profile, isolated=config.isolated)
    on_step("starting the stack" + (" in network namespaces" if config.isolated else ""))
    stack.start()
    try:
        with stack.as_client():
            client = _Client(stack.api_key)
            try:
                rows = []
                for edge in stack.edges:
                    on_step(f"measuring {edge.label}")
                    rows.append(_measure(stack, client, edge, config.requests))
                on_step("killing an origin mid-run")
                home = config.profile.home
                far = max(config.profile.customers, key=lambda c: c.pop_origin_ms[home])
                failover = _failover(stack, client, stack.edge(far, 2), config.failover_requests)
            finally:
                client.http.close()
    finally:
        stack.stop()
    return {
        "network": "namespaces" if config.isolated else "loopback",
        "profile": _profile_dict(config.profile),
        "requests": config.requests,
        "rows": [row.to_dict() for row in rows],
        "failover": failover,
        "checks": _checks(config.profile, rows, failover),
    }


def _profile_dict(profile: GeoProfile) -> dict[str, Any]:
    return {
        "customers": [
            {"name": c.name, "cf": dict(c.cf), "client_pop_ms": c.client_pop_ms,
             "pop_origin_ms": dict(c.pop_origin_ms)}
            for c in profile.customers
        ],
        "home": profile.home,
        "second": profile.second,
        "origin_primary_ms": dict(profile.origin_primary_ms),
        "origin_replica_ms": profile.origin_replica_ms,
        "replication_ms": profile.replication_ms,
        "provider_latency_ms": profile.provider_latency_ms,
    }  # fmt: skip
