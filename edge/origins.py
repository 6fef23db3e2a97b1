"""Several origins, each in its region: which to ask first for a request, and which to avoid.

Pure (no runtime, no I/O): the handler asks ``Origins.plan`` for the order to try the
origins in, and tells ``Origins.failed`` about one that did not answer.

Bindings:

- ``PRISM_ORIGINS``: ``region=url`` pairs, comma-separated, e.g.
  ``us-west-1=https://a.example,ap-south-1=https://b.example``. The order is the
  preference among origins equally near a request. Without it, ``ORIGIN_URL`` is a
  one-origin list (no region, no failover).
- ``PRISM_ORIGIN_REGIONS`` (optional): where each region is near, overriding the
  built-in table region by region: ``region=place,place;region=place``, where a place
  is a continent code as Workers' ``request.cf.continent`` spells it (``AF AN AS EU NA
  OC SA``), ``country:XX`` (``cf.country``, ISO 3166 alpha-2) or ``colo:XXX`` (``cf.colo``,
  the data centre's IATA code). E.g. ``ap-south-1=AS,country:AE;eu-west-1=EU,AF``.

Ranking for a request from ``(continent, country, colo)``: an origin whose region names
that colo comes first, then one naming the country, then by the position of the
continent in the region's list (its home continent before the ones it also serves);
origins near nothing come last; ties keep the configured order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "CONTINENTS",
    "DEFAULT_AVOID_SECONDS",
    "DEFAULT_RECHECK_SECONDS",
    "DEFAULT_REGION_PLACES",
    "DEFAULT_TRIAL_SECONDS",
    "NOWHERE",
    "ORIGIN_DOWN",
    "Location",
    "Origin",
    "Origins",
    "parse_origins",
    "parse_region_places",
]

CONTINENTS = frozenset({"AF", "AN", "AS", "EU", "NA", "OC", "SA"})
DEFAULT_AVOID_SECONDS = 30.0
# How long the other requests keep avoiding an origin while one request is its trial:
# long enough for that request's probe to tell (probe delay + probe timeout, and more).
DEFAULT_TRIAL_SECONDS = 5.0
# How often an avoided origin's liveness is asked in the background (by the forwarder,
# after a response): it is back within this long of answering, and no request pays.
DEFAULT_RECHECK_SECONDS = 5.0
# An origin's reply that means the origin itself did not answer, when the reply lacks the
# Prism origin's contract headers (every answer it renders has them): what stands in
# front of it (a load balancer with no healthy target) said so. The Prism origin's own
# 5xx (a provider failure it relays after its own retries and hedges) is passed on and
# never retried elsewhere: that would call the providers again.
ORIGIN_DOWN = frozenset({502, 503, 504})

# Cloud regions by the continents they serve, home continent first. AWS names, and the
# same places under GCP's names; a region not listed is near nowhere unless overridden.
_AMERICAS_NORTH = ("NA", "SA")
_AMERICAS_SOUTH = ("SA", "NA")
_EUROPE = ("EU", "AF")
_MIDDLE_EAST = ("AS", "AF", "EU")
_ASIA = ("AS", "OC")
_OCEANIA = ("OC", "AS")
DEFAULT_REGION_PLACES: Mapping[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ("us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1", "ca-west-1"),
        _AMERICAS_NORTH,
    ),
    **dict.fromkeys(("us-central1", "us-east4", "us-west1", "northamerica-northeast1"),
                    _AMERICAS_NORTH),
    **dict.fromkeys(("sa-east-1", "southamerica-east1", "mx-central-1"), _AMERICAS_SOUTH),
    **dict.fromkeys(
        ("eu-west-1", "eu-west-2", "eu-west-3", "eu-central-1", "eu-central-2", "eu-north-1",
         "eu-south-1", "eu-south-2", "europe-west1", "europe-west2", "europe-west3",
         "europe-west4", "europe-north1"),
        _EUROPE,
    ),
    **dict.fromkeys(("me-south-1", "me-central-1", "il-central-1", "me-west1"), _MIDDLE_EAST),
    "af-south-1": ("AF", "EU"),
    **dict.fromkeys(
        ("ap-south-1", "ap-south-2", "ap-east-1", "ap-northeast-1", "ap-northeast-2",
         "ap-northeast-3", "ap-southeast-1", "ap-southeast-3", "ap-southeast-5",
         "asia-south1", "asia-east1", "asia-northeast1", "asia-southeast1"),
        _ASIA,
    ),
    **dict.fromkeys(("ap-southeast-2", "ap-southeast-4", "australia-southeast1"), _OCEANIA),
}  # fmt: skip

_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_COUNTRY, _COLO = "country:", "colo:"
_NO_PLACE = 1_000  # the rank of an origin near nothing the request says
_PLANS = 256  # locations whose order is remembered per isolate


@dataclass(frozen=True, slots=True)
class Origin:
    region: str  # "" for the one origin of ORIGIN_URL
    url: str  # no trailing slash
    places: tuple[str, ...] = field(default=(), compare=False)


class Location(NamedTuple):
    """Where a request comes from, as the Workers runtime says (``request.cf``)."""

    continent: str = ""
    country: str = ""
    colo: str = ""


NOWHERE = Location()


def _url(url: str, what: str) -> str:
    url = url.strip()
    if not url.startswith(("https://", "http://")) or len(url) <= len("https://"):
        raise ValueError(f"{what}: the origin URL must start with https:// (got {url[:80]!r})")
    return url.rstrip("/")


def parse_region_places(text: str) -> dict[str, tuple[str, ...]]:
    """``PRISM_ORIGIN_REGIONS`` as ``{region: places}``; a ValueError says what is wrong."""
    found: dict[str, tuple[str, ...]] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        region, sep, places = item.partition("=")
        region = region.strip()
        if not sep or not _REGION.fullmatch(region):
            raise ValueError(f"PRISM_ORIGIN_REGIONS: expected region=places, got {item[:80]!r}")
        parsed: list[str] = []
        for place in filter(None, (p.strip() for p in places.split(","))):
            if place.startswith(_COUNTRY) and len(place) == len(_COUNTRY) + 2:
                parsed.append(_COUNTRY + place[len(_COUNTRY) :].upper())
            elif place.startswith(_COLO) and 3 <= len(place) - len(_COLO) <= 4:
                parsed.append(_COLO + place[len(_COLO) :].upper())
            elif place.upper() in CONTINENTS:
                parsed.append(place.upper())
            else:
                raise ValueError(
                    f"PRISM_ORIGIN_REGIONS: {place[:40]!r} is not a continent code "
                    f"({' '.join(sorted(CONTINENTS))}), country:XX or colo:XXX"
                )
        found[region] = tuple(parsed)
    return found


def parse_origins(
    origins: str | None,
    origin_url: str | None,
    region_places: str | None = None,
) -> tuple[Origin, ...]:
    """The origins from ``PRISM_ORIGINS`` (else ``ORIGIN_URL`` as a one-origin list), each
    with its places from the built-in table, overridden by ``PRISM_ORIGIN_REGIONS``."""
    table = {**DEFAULT_REGION_PLACES, **parse_region_places(region_places or "")}
    if not origins or not origins.strip():
        return (Origin("", _url(origin_url, "ORIGIN_URL")),) if origin_url else ()
    found: list[Origin] = []
    for item in filter(None, (part.strip() for part in origins.split(","))):
        region, sep, url = item.partition("=")
        region = region.strip()
        if not sep or not _REGION.fullmatch(region):
            raise ValueError(
                f"PRISM_ORIGINS: expected region=url (a region like us-west-1), got {item[:80]!r}"
            )
        if any(origin.region == region for origin in found):
            raise ValueError(f"PRISM_ORIGINS: region {region} is listed twice")
        found.append(Origin(region, _url(url, f"PRISM_ORIGINS ({region})"), table.get(region, ())))
    return tuple(found)


def _rank(origin: Origin, where: Location) -> int:
    best = _NO_PLACE
    for position, place in enumerate(origin.places):
        if place == where.continent:
            best = min(best, 2 + position)
        elif place.startswith(_COUNTRY) and place[len(_COUNTRY) :] == where.country:
            best = min(best, 1)
        elif place.startswith(_COLO) and place[len(_COLO) :] == where.colo:
            return 0
    return best


class Origins:
    """One per isolate: the origins, the order per location, and the ones marked down.

    A mark says "down until"; while it holds, the origin is tried last, and every
    ``recheck_seconds`` it is ``due``: the forwarder asks its liveness in the background
    (an answer clears the mark, no answer renews it), so traffic returns within a recheck
    of the origin answering and no request waits to find out. Where no recheck told
    (an isolate with no traffic meanwhile), the mark passes and the next request is the
    origin's trial: it asks the origin in its place again, and the mark is pushed back by
    ``trial_seconds`` meanwhile, so the other requests keep avoiding it until the trial
    tells (one request at a time, not a rush). ``dirty`` says the marks changed since
    ``marks()`` was last read (the forwarder shares them with the PoP's isolates).
    """

    def __init__(
        self,
        origins: tuple[Origin, ...],
        avoid_seconds: float = DEFAULT_AVOID_SECONDS,
        trial_seconds: float = DEFAULT_TRIAL_SECONDS,
        recheck_seconds: float = DEFAULT_RECHECK_SECONDS,
    ) -> None:
        if not origins:
            raise ValueError("no origin configured")
        self.origins = origins
        self.avoid_seconds = avoid_seconds
        self.trial_seconds = trial_seconds
        self.recheck_seconds = recheck_seconds
        self._by_region = {origin.region: origin for origin in origins}
        self._plans: dict[Location, tuple[Origin, ...]] = {}
        # The marks: origin -> down until (read by the forwarder; changed only here).
        self.down_until: dict[Origin, float] = {}
        # When this isolate last found each marked origin down, and last asked it again.
        self._failed_at: dict[Origin, float] = {}
        self._asked_at: dict[Origin, float] = {}
        self.dirty = False

    def nearest(self, where: Location) -> tuple[Origin, ...]:
        """Every origin, nearest to ``where`` first (remembered per location)."""
        plan = self._plans.get(where)
        if plan is None:
            plan = tuple(sorted(self.origins, key=lambda origin: _rank(origin, where)))
            if len(self._plans) >= _PLANS:
                self._plans.clear()  # rebuilt on demand; a sort of a handful of origins
            self._plans[where] = plan
        return plan

    def plan(self, locate: Callable[[], Location], now: float) -> tuple[Origin, ...]:
        """The order to try the origins in: nearest first, the ones marked down last
        (still tried: never give up on a request without asking every origin).
        ``locate`` is called only when there is a choice to make."""
        if len(self.origins) == 1:
            return self.origins
        plan = self.nearest(locate())
        if self.down_until:
            down = self.down_until
            avoided: list[Origin] = []
            for origin, until in list(down.items()):
                if until <= now:  # this request is its trial; the others wait for it
                    down[origin] = now + self.trial_seconds
                    self.dirty = True
                else:
                    avoided.append(origin)
            if avoided:
                plan = tuple(sorted(plan, key=lambda origin: origin in avoided))  # stable
        return plan

    def failed(self, origin: Origin, now: float) -> None:
        """``origin`` did not answer: try the others first for a while."""
        if len(self.origins) > 1:
            self.down_until[origin] = now + self.avoid_seconds
            self._failed_at[origin] = self._asked_at[origin] = now
            self.dirty = True

    def answered(self, origin: Origin) -> None:
        """``origin`` answered: no reason to avoid it any longer."""
        if self.down_until and self.down_until.pop(origin, None) is not None:
            self._failed_at.pop(origin, None)
            self._asked_at.pop(origin, None)
            self.dirty = True

    def failed_since(self, origin: Origin, since: float) -> bool:
        """Whether this isolate found ``origin`` down at or after ``since``."""
        return self._failed_at.get(origin, -math.inf) >= since

    def due(self, now: float) -> tuple[Origin, ...]:
        """The avoided origins whose liveness is due to be asked again (each is then not
        due for another ``recheck_seconds``). The forwarder asks only when ``down_until``
        holds a mark: a forward when all is well makes no call."""
        found = []
        for origin, until in self.down_until.items():
            if until > now and now - self._asked_at.get(origin, -math.inf) >= self.recheck_seconds:
                self._asked_at[origin] = now
                found.append(origin)
        return tuple(found)

    def merge(self, marks: Mapping[str, float]) -> None:
        """Marks another isolate set (``{region: down until}``): the later one holds."""
        for region, until in marks.items():
            origin = self._by_region.get(region)
            if origin is not None and until > self.down_until.get(origin, 0.0):
                self.down_until[origin] = until

    def marks(self) -> dict[str, float]:
        """This isolate's marks as ``{region: down until}``; ``dirty`` is reset."""
        self.dirty = False
        return {origin.region: until for origin, until in self.down_until.items()}

    def avoided(self, now: float) -> tuple[str, ...]:
        """The regions being avoided at ``now`` (for tests and logs)."""
        return tuple(o.region for o, until in self.down_until.items() if until > now)
