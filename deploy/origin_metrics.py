"""What `prism top` shows, worked out from what a running origin's admin listener says.

Pure: the command (``deploy/commands/top.py``) fetches the texts and JSON; this module
parses them and puts one frame together.

- ``/metrics`` (Prometheus text) → ``Totals`` (``origin.dashboard.figures``: the same
  reading the dashboard makes of the same counters), and two of them → ``Rates``.
- ``/healthz`` in detail → ``HealthReport``: Redis, each provider's health gate (state,
  error rate, p50/p95 time to first byte), the KV writer.
- ``/dashboard/latest`` (with the admin key) → spend today per project, every origin's,
  from Redis. Without it, the spend shown is this process's since it started
  (``prism_usage_cost_usd``), and the frame says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from origin.dashboard import Rates, Totals, rates_between, totals_of
from origin.dashboard.figures import HIT_LAYERS, LAYERS
from origin.dashboard.history import ProviderPoint, provider_point

__all__ = [
    "Frame",
    "HealthReport",
    "ProjectSpend",
    "frame_of",
    "parse_health",
    "parse_metrics",
    "parse_spend",
]


def parse_metrics(text: str, at: float) -> Totals:
    """The figures in a ``/metrics`` page read at ``at``; ``ValueError`` if it is not
    Prometheus text."""
    try:
        return totals_of(text_string_to_metric_families(text), at)
    except (ValueError, IndexError, TypeError) as error:
        raise ValueError(f"/metrics is not Prometheus text: {error}") from None


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class HealthReport:
    status: str
    version: str
    uptime_seconds: float
    redis_ok: bool
    providers: Mapping[str, ProviderPoint]
    kv_enabled: bool
    kv_queued: int


def parse_health(body: object) -> HealthReport:
    """The admin ``/healthz`` JSON; ``ValueError`` when it is not that (a public
    ``/healthz`` has no providers: the URL is not the admin listener's)."""
    if not isinstance(body, dict) or not isinstance(body.get("providers"), dict):
        raise ValueError(
            "/healthz has no provider details: is this the admin listener"
            " (PRISM_ADMIN_PORT, 9090 by default), not the public port?"
        )
    kv, redis = _object(body.get("kv_writer")), _object(body.get("redis"))
    return HealthReport(
        status=str(body.get("status", "?")),
        version=str(body.get("version", "?")),
        uptime_seconds=float(body.get("uptime_seconds") or 0.0),
        redis_ok=bool(redis.get("ok")),
        providers={
            str(name): provider_point(point)
            for name, point in body["providers"].items()
            if isinstance(point, dict)
        },
        kv_enabled=bool(kv.get("enabled")),
        kv_queued=int(kv.get("queued") or 0),
    )


@dataclass(frozen=True, slots=True)
class ProjectSpend:
    cost_usd: float
    saved_usd: float | None = None  # unknown from /metrics alone
    hits: int | None = None
    calls: int | None = None


def parse_spend(latest: object) -> dict[str, ProjectSpend] | None:
    """Spend today per project from ``/dashboard/latest``; None when it has none (no
    sample yet, or Redis could not be read)."""
    if not isinstance(latest, dict) or not isinstance(latest.get("projects"), dict):
        return None
    spend: dict[str, ProjectSpend] = {}
    for name, day in latest["projects"].items():
        if not isinstance(day, dict):
            continue
        requests = _object(day.get("requests"))
        spend[str(name)] = ProjectSpend(
            cost_usd=float(day.get("cost_usd") or 0.0),
            saved_usd=float(day.get("saved_usd") or 0.0),
            hits=sum(int(requests.get(layer) or 0) for layer in HIT_LAYERS),
            calls=int(requests.get("miss") or 0) + int(requests.get("bypass") or 0),
        )
    return spend


@dataclass(frozen=True, slots=True)
class Frame:
    """One refresh of `prism top`."""

    url: str
    totals: Totals
    rates: Rates | None  # None on the first scrape: nothing to compare with yet
    health: HealthReport
    spend: Mapping[str, ProjectSpend]
    spend_scope: str  # "today" (every origin, Redis) or "process" (since this origin started)
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        rates = self.rates
        return {
            "url": self.url,
            "at": self.totals.at,
            "version": self.health.version,
            "status": self.health.status,
            "uptime_seconds": self.health.uptime_seconds,
            "interval_seconds": None if rates is None else round(rates.seconds, 3),
            "requests": {  # kv: the edge's hits, as its records told this origin
                layer: {
                    "total": self.totals.requests.get(layer, 0.0),
                    "per_second": None if rates is None else rates.requests.get(layer, 0.0),
                }
                for layer in LAYERS
            },
            "hit_ratio": None if rates is None else rates.hit_ratio,
            "hit_ratio_since_start": self.totals.hit_ratio,
            "server_errors_per_second": None if rates is None else rates.server_errors,
            "redis_ok": self.health.redis_ok,
            "event_loop": {
                "lag_seconds": self.totals.loop_lag,
                "refused": self.totals.loop_lag_refused,
            },
            "providers": {
                name: {
                    **point.as_dict(),
                    "calls_per_second": None
                    if rates is None
                    else rates.provider_calls.get(name, 0.0),
                }
                for name, point in self.health.providers.items()
            },
            "spend": {
                "scope": self.spend_scope,
                "projects": {
                    name: {
                        "cost_usd": s.cost_usd,
                        "saved_usd": s.saved_usd,
                        "hits": s.hits,
                        "calls": s.calls,
                    }
                    for name, s in self.spend.items()
                },
            },
            "kv_writer": {
                "enabled": self.health.kv_enabled,
                "queued": self.totals.kv_queued,
                "in_flight": self.totals.kv_in_flight,
                "sent": self.totals.kv_sent,
                "dropped": self.totals.kv_dropped,
                "sent_per_second": None if rates is None else rates.kv_sent,
                "dropped_per_second": None if rates is None else rates.kv_dropped,
            },
            "notes": list(self.notes),
        }


def frame_of(
    url: str,
    previous: Totals | None,
    totals: Totals,
    health: HealthReport,
    spend_today: Mapping[str, ProjectSpend] | None,
    notes: tuple[str, ...] = (),
) -> Frame:
    """One frame: rates against ``previous`` (if any); today's spend when the dashboard
    gave it, else this process's since it started."""
    rates = rates_between(previous, totals) if previous is not None else None
    if spend_today is not None:
        spend, scope = dict(spend_today), "today"
    else:
        spend = {name: ProjectSpend(cost) for name, cost in sorted(totals.cost_usd.items())}
        scope = "process"
    return Frame(url, totals, rates, health, spend, scope, notes)
