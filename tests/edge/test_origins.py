"""Choosing among several origins (edge/origins.py): parse, rank, avoid; no runtime."""

from __future__ import annotations

import asyncio

import pytest

from edge.handler import EdgeHandler
from edge.origins import (
    NOWHERE,
    Location,
    Origin,
    Origins,
    parse_origins,
    parse_region_places,
)
from edge.platform import EdgeRequest
from edge.settings import EdgeSettings
from tests.fixtures.edge import OriginReply, StubPlatform
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET

TWO = "us-west-1=https://a.example/,ap-south-1=https://b.example"
THREE = TWO + ",eu-west-1=https://c.example"
EUROPE = Location("EU", "DE", "FRA")
INDIA = Location("AS", "IN", "BOM")
BRAZIL = Location("SA", "BR", "GRU")


def regions(origins: tuple[Origin, ...]) -> list[str]:
    return [origin.region for origin in origins]


def test_origins_are_parsed_in_order_with_their_regions_and_places() -> None:
    origins = parse_origins(TWO, None)
    assert [(o.region, o.url) for o in origins] == [
        ("us-west-1", "https://a.example"),
        ("ap-south-1", "https://b.example"),
    ]
    assert origins[0].places == ("NA", "SA")
    assert origins[1].places == ("AS", "OC")


def test_origin_url_alone_is_a_one_origin_list_and_prism_origins_wins() -> None:
    assert parse_origins(None, "http://127.0.0.1:8080/") == (Origin("", "http://127.0.0.1:8080"),)
    assert regions(parse_origins(TWO, "http://ignored.example")) == ["us-west-1", "ap-south-1"]
    assert parse_origins("", None) == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("https://a.example", "expected region=url"),
        ("US West=https://a.example", "expected region=url"),
        ("us-west-1=ftp://a.example", "must start with https://"),
        ("us-west-1=https://a.example,us-west-1=https://b.example", "listed twice"),
    ],
)
def test_bad_origin_lists_say_what_is_wrong(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_origins(value, None)


def test_region_places_override_the_table_region_by_region() -> None:
    assert parse_region_places("ap-south-1=as, country:ae ;x-1=colo:fra,EU") == {
        "ap-south-1": ("AS", "country:AE"),
        "x-1": ("colo:FRA", "EU"),
    }
    origins = parse_origins(TWO + ",x-1=https://x.example", None, "us-west-1=EU;x-1=OC")
    assert [o.places for o in origins] == [("EU",), ("AS", "OC"), ("OC",)]
    for bad in ("ap-south-1", "ap-south-1=Europe", "ap-south-1=country:IND"):
        with pytest.raises(ValueError, match="PRISM_ORIGIN_REGIONS"):
            parse_region_places(bad)


def test_the_nearest_origin_comes_first_ties_keep_the_configured_order() -> None:
    origins = Origins(parse_origins(THREE, None))
    assert regions(origins.nearest(EUROPE)) == ["eu-west-1", "us-west-1", "ap-south-1"]
    assert regions(origins.nearest(INDIA)) == ["ap-south-1", "us-west-1", "eu-west-1"]
    # South America is us-west-1's second continent; the others serve it not at all.
    assert regions(origins.nearest(BRAZIL)) == ["us-west-1", "ap-south-1", "eu-west-1"]
    # Africa: Europe's second continent; nothing known: the configured order.
    assert regions(origins.nearest(Location("AF", "ZA", "JNB")))[0] == "eu-west-1"
    assert regions(origins.nearest(NOWHERE)) == ["us-west-1", "ap-south-1", "eu-west-1"]


def test_a_colo_beats_a_country_beats_a_continent() -> None:
    places = "us-west-1=EU;ap-south-1=country:DE;eu-west-1=colo:FRA"
    origins = Origins(parse_origins(THREE, None, places))
    assert regions(origins.nearest(EUROPE)) == ["eu-west-1", "ap-south-1", "us-west-1"]
    assert regions(origins.nearest(Location("EU", "DE", "HAM")))[0] == "ap-south-1"
    assert regions(origins.nearest(Location("EU", "FR", "CDG")))[0] == "us-west-1"


def test_a_failed_origin_is_tried_last_for_a_while_then_first_again() -> None:
    origins = Origins(parse_origins(THREE, None), avoid_seconds=30)
    eu = origins.nearest(EUROPE)[0]
    origins.failed(eu, now=100.0)
    assert regions(origins.plan(lambda: EUROPE, 110.0)) == ["us-west-1", "ap-south-1", "eu-west-1"]
    assert origins.avoided(110.0) == ("eu-west-1",)
    # Another location's nearest is unaffected by the order, and the avoided one stays last.
    assert regions(origins.plan(lambda: INDIA, 110.0)) == ["ap-south-1", "us-west-1", "eu-west-1"]
    assert regions(origins.plan(lambda: EUROPE, 130.0))[0] == "eu-west-1"  # its trial
    # While the trial runs the other requests keep avoiding it; its answer ends the mark.
    assert regions(origins.plan(lambda: EUROPE, 131.0))[0] == "us-west-1"
    origins.answered(eu)
    assert origins.avoided(131.0) == ()
    assert regions(origins.plan(lambda: EUROPE, 131.0))[0] == "eu-west-1"


def test_an_origin_is_tried_again_by_one_request_at_a_time() -> None:
    origins = Origins(parse_origins(THREE, None), avoid_seconds=30, trial_seconds=5)
    eu = origins.nearest(EUROPE)[0]
    origins.failed(eu, now=100.0)
    origins.marks()
    assert regions(origins.plan(lambda: EUROPE, 130.0))[0] == "eu-west-1"
    assert origins.dirty and origins.marks() == {"eu-west-1": 135.0}  # shared with the PoP
    assert regions(origins.plan(lambda: EUROPE, 134.0))[0] == "us-west-1"
    origins.failed(eu, now=134.0)  # the trial failed: a new mark
    assert origins.marks() == {"eu-west-1": 164.0}
    assert regions(origins.plan(lambda: EUROPE, 140.0))[0] == "us-west-1"


def test_an_avoided_origin_is_due_for_a_recheck_every_interval_until_it_answers() -> None:
    origins = Origins(parse_origins(THREE, None), avoid_seconds=30, recheck_seconds=5)
    assert origins.due(100.0) == ()  # nothing marked: nothing to ask
    eu = origins.nearest(EUROPE)[0]
    origins.failed(eu, now=100.0)
    assert origins.due(104.0) == ()  # just found down
    assert origins.due(105.0) == (eu,)
    assert origins.due(106.0) == ()  # asked; not due again for another interval
    origins.failed(eu, now=106.5)  # the recheck found it down: the mark is renewed
    assert origins.avoided(130.0) == ("eu-west-1",)
    assert origins.due(111.0) == ()
    assert origins.due(111.5) == (eu,)
    origins.answered(eu)  # the next one found it up
    assert origins.due(120.0) == ()
    assert regions(origins.plan(lambda: EUROPE, 120.0))[0] == "eu-west-1"


def test_a_failure_is_known_to_the_attempts_already_in_flight() -> None:
    origins = Origins(parse_origins(THREE, None), avoid_seconds=30)
    eu = origins.nearest(EUROPE)[0]
    assert not origins.failed_since(eu, 90.0)
    origins.failed(eu, now=100.0)
    assert origins.failed_since(eu, 99.0)  # sent before the failure was found
    assert not origins.failed_since(eu, 100.5)  # sent after: its own probe tells
    assert origins.due(105.0) == (eu,)
    assert not origins.failed_since(eu, 100.5)  # asking again is no failure
    origins.answered(eu)
    assert not origins.failed_since(eu, 0.0)


def test_marks_from_other_isolates_are_merged_the_later_one_holding() -> None:
    origins = Origins(parse_origins(THREE, None), avoid_seconds=30)
    eu = origins.nearest(EUROPE)[0]
    origins.merge({"eu-west-1": 120.0, "nowhere-1": 500.0})
    assert regions(origins.plan(lambda: EUROPE, 110.0))[0] == "us-west-1"
    assert not origins.dirty  # learned, not news
    origins.merge({"eu-west-1": 115.0})
    assert origins.avoided(119.0) == ("eu-west-1",)
    origins.answered(eu)
    assert origins.dirty and origins.marks() == {}


def test_an_origin_that_answers_is_no_longer_avoided() -> None:
    origins = Origins(parse_origins(TWO, None))
    first = origins.origins[0]
    origins.failed(first, now=0.0)
    assert regions(origins.plan(lambda: NOWHERE, 1.0)) == ["ap-south-1", "us-west-1"]
    origins.answered(first)
    assert regions(origins.plan(lambda: NOWHERE, 1.0)) == ["us-west-1", "ap-south-1"]


def test_every_origin_avoided_still_tries_every_origin() -> None:
    origins = Origins(parse_origins(TWO, None))
    for origin in origins.origins:
        origins.failed(origin, now=0.0)
    assert sorted(regions(origins.plan(lambda: INDIA, 1.0))) == ["ap-south-1", "us-west-1"]


def test_one_origin_never_asks_where_the_request_comes_from() -> None:
    origins = Origins(parse_origins(None, "https://only.example"))

    def locate() -> Location:
        raise AssertionError("no choice to make")

    origins.failed(origins.origins[0], now=0.0)
    assert origins.plan(locate, 1.0) == origins.origins
    assert origins.avoided(1.0) == ()


def test_edge_settings_read_the_origin_bindings() -> None:
    env = {
        "PRISM_KEY_SECRET": KEY_SECRET,
        "PRISM_FORWARD_SECRET": FORWARD_SECRET,
        "PRISM_ORIGINS": TWO,
        "PRISM_ORIGIN_REGIONS": "us-west-1=EU",
        "PRISM_ORIGIN_AVOID_SECONDS": "5",
    }
    settings = EdgeSettings.from_env(env.get)
    assert regions(settings.origins) == ["us-west-1", "ap-south-1"]
    assert settings.origins[0].url == "https://a.example"
    assert settings.origins[0].places == ("EU",)
    assert settings.origin_avoid == 5.0
    del env["PRISM_ORIGINS"]
    with pytest.raises(ValueError, match="ORIGIN_URL"):
        EdgeSettings.from_env(env.get)


def test_with_every_origin_down_each_is_asked_once_and_the_last_reply_passed_on(
    api_key: str,
) -> None:
    env = {"PRISM_KEY_SECRET": KEY_SECRET, "PRISM_FORWARD_SECRET": FORWARD_SECRET}
    handler = EdgeHandler(EdgeSettings.from_env({**env, "PRISM_ORIGINS": TWO}.get))
    platform = StubPlatform(lambda: OriginReply(503), INDIA)  # a proxy answering a bare 503
    request = EdgeRequest(
        "POST", "/v1/chat/completions", "", {"authorization": f"Bearer {api_key}"}
    )
    response = asyncio.run(handler.handle(request, platform))
    assert response.status == 503
    assert response.headers["x-prism-origin-region"] == "us-west-1"
    assert 'origin-error;desc="ap-south-1"' in response.headers["server-timing"]
    urls = [url for url, _, _ in platform.sent]
    assert urls == [
        "https://b.example/v1/chat/completions",
        "https://a.example/v1/chat/completions",
    ]
    bodies = {sent for _, _, sent in platform.sent}
    assert len(bodies) == 1 and None not in bodies  # the same bytes, sent again
    assert handler.origins.avoided(platform.clock) == ("ap-south-1", "us-west-1")
