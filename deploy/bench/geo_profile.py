"""Where `prism bench geo` puts things: customers, their PoPs, two origin regions, and the
round-trip times between them, as data.

The times are typical public round trips between those places (rounded): a customer
close to its Cloudflare PoP, the PoP far from or near an origin, the origin next to its
Redis. Every link is a delay proxy adding half the round trip each way. One region: the
origin in ap-south-1 (Mumbai), next to the Redis primary; two: a second origin in
us-west-1 reading a replica next to it, its writes (entries, usage) going to the primary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

__all__ = ["DEFAULT_PROFILE", "Customer", "GeoProfile"]


@dataclass(frozen=True, slots=True)
class Customer:
    key: str  # short, for Worker names: "sin"
    name: str  # for people: "Singapore"
    cf: Mapping[str, str]  # its PoP's request.cf (continent, country, colo)
    client_pop_ms: float  # round trip, the customer to its PoP
    pop_origin_ms: Mapping[str, float]  # round trip, its PoP to each origin region


@dataclass(frozen=True, slots=True)
class GeoProfile:
    customers: tuple[Customer, ...]
    home: str  # the one region (and the Redis primary's)
    second: str  # the region added, reading a Redis replica next to it
    origin_primary_ms: Mapping[str, float]  # round trip, each origin to the Redis primary
    origin_replica_ms: float  # round trip, the second origin to its replica
    replication_ms: float  # round trip, the replica to its primary
    provider_latency_ms: float  # the provider's fixed time to answer (its own option)

    def scaled(self, factor: float) -> GeoProfile:
        """Every distance times ``factor`` (a quick run: the same shape, shorter)."""

        def times(table: Mapping[str, float]) -> Mapping[str, float]:
            return MappingProxyType({k: v * factor for k, v in table.items()})

        return replace(
            self,
            customers=tuple(
                replace(
                    c,
                    client_pop_ms=c.client_pop_ms * factor,
                    pop_origin_ms=times(c.pop_origin_ms),
                )
                for c in self.customers
            ),
            origin_primary_ms=times(self.origin_primary_ms),
            origin_replica_ms=self.origin_replica_ms * factor,
            replication_ms=self.replication_ms * factor,
            provider_latency_ms=self.provider_latency_ms * factor,
        )


DEFAULT_PROFILE = GeoProfile(
    customers=(
        Customer(
            "sin",
            "Singapore",
            MappingProxyType({"continent": "AS", "country": "SG", "colo": "SIN"}),
            client_pop_ms=10,
            pop_origin_ms=MappingProxyType({"ap-south-1": 60, "us-west-1": 170}),
        ),
        Customer(
            "sfo",
            "San Francisco",
            MappingProxyType({"continent": "NA", "country": "US", "colo": "SFO"}),
            client_pop_ms=10,
            pop_origin_ms=MappingProxyType({"ap-south-1": 250, "us-west-1": 20}),
        ),
    ),
    home="ap-south-1",
    second="us-west-1",
    origin_primary_ms=MappingProxyType({"ap-south-1": 1, "us-west-1": 220}),
    origin_replica_ms=1,
    replication_ms=220,
    provider_latency_ms=300,
)
