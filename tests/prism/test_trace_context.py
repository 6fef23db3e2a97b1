"""The edge's trace headers: a client's traceparent continued, a broken one replaced, and
the edge's span as the origin reads it back."""

from __future__ import annotations

from prism.trace_context import (
    EDGE_SPAN,
    EDGE_TIMING,
    TRACEPARENT,
    edge_trace_headers,
    parse_edge_span,
    parse_stages,
    parse_traceparent,
)

CLIENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_is_read_and_broken_ones_are_not() -> None:
    parsed = parse_traceparent(CLIENT)
    assert parsed is not None
    assert parsed.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert (parsed.span_id, parsed.flags) == ("00f067aa0ba902b7", "01")
    for broken in (
        None,
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # v00 has no more
    ):
        assert parse_traceparent(broken) is None, broken
    # A later version may carry more fields: its first four are still read.
    assert parse_traceparent(CLIENT.replace("00-", "01-", 1) + "-more") is not None


def test_the_edge_continues_the_clients_trace_under_a_span_of_its_own() -> None:
    stages = [("auth", 0.5), ("parse", 0.0), ("kv", 3.5)]
    headers = edge_trace_headers(CLIENT, 1_700_000_000.004, stages)
    sent = parse_traceparent(headers[TRACEPARENT])
    assert sent is not None
    assert sent.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and sent.flags == "01"
    assert sent.span_id != "00f067aa0ba902b7"  # the edge's own span
    edge = parse_edge_span(headers[EDGE_SPAN], headers[EDGE_TIMING])
    assert edge is not None
    assert edge.parent_span_id == "00f067aa0ba902b7"
    assert abs(edge.start_ms - (1_700_000_000_004 - 4.0)) < 0.01  # the stages before "now"
    assert edge.stages == stages


def test_with_no_usable_traceparent_the_edge_starts_a_trace() -> None:
    first = edge_trace_headers(None, 1.0, [])
    second = edge_trace_headers("garbage", 1.0, [])
    one, two = parse_traceparent(first[TRACEPARENT]), parse_traceparent(second[TRACEPARENT])
    assert one is not None and two is not None and one.trace_id != two.trace_id
    assert one.flags == "01"
    edge = parse_edge_span(first[EDGE_SPAN], first.get(EDGE_TIMING))
    assert edge is not None and edge.parent_span_id is None and edge.stages == []


def test_malformed_edge_headers_give_no_edge_span_or_skip_the_bad_stages() -> None:
    for bad in (None, "", "start=", "start=abc", "start=-5", "x" * 300):
        assert parse_edge_span(bad, None) is None, bad
    edge = parse_edge_span("start=12.5;parent=XYZ", None)
    assert edge is not None and edge.parent_span_id is None  # a bad parent is dropped
    assert parse_stages('auth;dur=0.10, junk, origin-error;desc="eu";dur=2, kv;dur=1.2.3') == [
        ("auth", 0.1),
        ("origin-error", 2.0),
    ]
