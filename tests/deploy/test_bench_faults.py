"""`prism bench faults`: a smoke-sized run proves the harness; the targets are unit-tested.

The smoke run checks that every request is recorded and that the counts agree with
each other and with the provider stand-ins' own accounting, never the router's
targets: those are judged by ``evaluate``, tested here on synthetic runs.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy.bench.fault_load import BENCH_MODEL, chat_body, incomplete, streamed
from deploy.bench.fault_metrics import (
    RECORD_FIELDS,
    RequestRecord,
    demotion_seconds,
    evaluate,
    return_seconds,
    summarize,
)
from deploy.bench.faults import FaultBenchConfig, providers_toml
from deploy.bench.servers import BenchError
from origin.providers.config import load_provider_config
from tests.fixtures.stacks import CLI_START

PRISM = [sys.executable, "-m", "deploy.cli"]


# ---------------------------------------------------------------- the harness, for real


@pytest.mark.timeout(120)
def test_smoke_run_records_every_request_and_the_counts_add_up(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run = subprocess.run(
        [*PRISM, "bench", "faults", "--requests", "40", "--concurrency", "4",
         "--scenario", "outage", "--outage-lead", "0.5", "--outage-seconds", "1.5",
         "--recovery-seconds", "1.5", "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert json.loads((out / "latest-faults.json").read_text()) == result
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "latest-faults.png").stat().st_size > 0
    else:
        assert "matplotlib" in result["chart_skipped"]

    assert result["meta"]["record_fields"] == list(RECORD_FIELDS)
    assert list(result["scenarios"]) == ["healthy", "outage"], "the baseline runs first"
    for name, scenario in result["scenarios"].items():
        records = [RequestRecord.from_row(row) for row in scenario["records"]]
        summary, upstream = scenario["summary"], scenario["upstream"]
        assert len(records) == summary["requests"] == 40, name
        assert sum(r.stream for r in records) == summary["streamed"] == 20
        assert all(r.total >= 0 and (r.ttfb is None or r.ttfb <= r.total) for r in records)
        succeeded = sum(r.ok for r in records)
        assert summary["succeeded"] == succeeded
        assert sum(summary["answered_by"].values()) == succeeded
        assert sum(summary["failures"].values()) == 40 - succeeded
        calls = 0
        for provider, stats in upstream.items():
            assert sum(stats["outcomes"].values()) == stats["chat_requests"], provider
            assert len(scenario["arrivals"][provider]) == stats["chat_requests"], provider
            calls += stats["chat_requests"]
        assert summary["upstream_calls"] == calls >= 40, "every request reached a provider"

    healthy = result["scenarios"]["healthy"]
    assert healthy["summary"]["succeeded"] == 40
    assert healthy["upstream"]["primary"]["outcomes"].get("status", 0) == 0
    outage = result["scenarios"]["outage"]
    window = outage["summary"]["outage"]
    assert 0 < window["start_s"] < window["end_s"]
    assert outage["upstream"]["primary"]["outcomes"]["status"] >= 1, "the primary was down"
    assert set(window) == {"start_s", "end_s", "demotion_s", "return_s"}

    targets = {(row["scenario"], row["name"]) for row in result["targets"]}
    assert ("outage", "demotion after the outage starts") in targets
    assert ("outage", "back on the primary after the outage") in targets
    assert ("outage", "TTFB p99") in targets
    assert all(row["met"] in (True, False, None) for row in result["targets"])


def test_unknown_scenario_is_one_line_and_exit_2() -> None:
    run = subprocess.run(
        [*PRISM, "bench", "faults", "--scenario", "meteor"], capture_output=True, text=True,
        timeout=CLI_START,
    )  # fmt: skip
    assert run.returncode == 2
    assert "unknown scenario meteor" in run.stderr
    assert run.stderr.strip().count("\n") == 0


def test_the_origin_reads_the_providers_file_with_the_extra_settings(tmp_path: Path) -> None:
    urls = {"primary": "http://127.0.0.1:1001", "secondary": "http://127.0.0.1:1002"}
    path = tmp_path / "providers.toml"
    path.write_text(providers_toml(urls, {"first_byte_timeout": "2.5", "label": '"sick"'}))
    config = load_provider_config(path, {})
    targets = config.targets(BENCH_MODEL)
    assert [(spec.name, spec.base_url) for spec, _ in targets] == [
        ("primary", "http://127.0.0.1:1001/v1"),
        ("secondary", "http://127.0.0.1:1002/v1"),
    ]
    assert all(spec.first_byte_timeout == 2.5 and spec.label == "sick" for spec, _ in targets)
    with pytest.raises(BenchError, match="not TOML"):
        FaultBenchConfig(provider_settings={"first_byte_timeout": "[unclosed"})


def test_every_request_is_unique_and_half_stream() -> None:
    bodies = [chat_body("run", i) for i in range(10)]
    assert len({body for body, _ in bodies}) == 10
    assert [stream for _, stream in bodies] == [False, True] * 5
    assert all(json.loads(body)["stream"] == stream for body, stream in bodies)


def test_only_complete_answers_count_as_successes() -> None:
    done = b'data: {"choices": []}\n\ndata: [DONE]\n\n'
    assert incomplete(done, stream=True) is None
    assert incomplete(done[: -len(b"data: [DONE]\n\n")], stream=True) == "stream without [DONE]"
    finished = json.dumps({"choices": [{"finish_reason": "stop"}]}).encode()
    assert incomplete(finished, stream=False) is None
    assert incomplete(finished[:20], stream=False) == "unparsable body"
    unfinished = json.dumps({"choices": [{"finish_reason": None}]}).encode()
    assert incomplete(unfinished, stream=False) == "unfinished choice"


def sse(*contents: str, resumed: bool = False) -> bytes:
    chunks: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": {"content": c}}]} for c in contents
    ]
    if resumed:
        chunks[-1]["prism"] = {"providers": ["primary", "secondary"], "resumed": True}
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


def test_a_stream_must_be_the_stand_ins_whole_answer_and_says_when_it_was_resumed() -> None:
    question = "fault bench run request 3"
    whole = sse("Echo: fault bench", " run request 3 [0a1b2c3d4e]", resumed=True)
    assert incomplete(whole, stream=True, question=question) is None
    assert streamed(whole) == ("Echo: fault bench run request 3 [0a1b2c3d4e]", True)
    repeated = sse("Echo: fault bench", " bench run request 3 [0a1b2c3d4e]")
    lost = sse("Echo: fault", " run request 3 [0a1b2c3d4e]")
    for spoiled in (repeated, lost):
        assert incomplete(spoiled, stream=True, question=question) == "stream text lost or repeated"
    assert streamed(lost)[1] is False


def test_resumed_scenarios_count_broken_streams_finished_and_a_stalls_whole_time() -> None:
    records = [
        record(0.0, stream=True, resumed=True, total=2.1),
        record(0.1, stream=True, resumed=True, total=2.4),
        record(0.2, stream=True),
        record(0.3, stream=True, ok=False, error="stream without [DONE]"),  # lost
    ]
    summary = summarize(records, {"p": {"chat_requests": 6}}, primary="primary")
    assert summary["resumed"]["completed"] == 2 and summary["cut_midway"] == 1
    assert summary["extra_upstream_calls"] == 0.0  # a resumption's call is not waste
    scenario = {"summary": summary, "resume": True, "fault": {"mode": "stall_mid_stream"}}
    rows = {
        row.name: row for row in evaluate({"hedge_delay_s": 0.25, "scenarios": {"s": scenario}})
    }
    finished = rows["broken streams finished by the secondary, text whole"]
    assert finished.measured.startswith("66.67% (2/3)") and finished.met is False
    assert rows["a stalled stream's whole time, resumed (p99)"].met is True


# ---------------------------------------------------------------- metrics on synthetic runs


def record(start: float, provider: str = "primary", ok: bool = True, **extra: Any) -> RequestRecord:
    fields: dict[str, Any] = {"ttfb": 0.05, "total": 0.1, "status": 200, "stream": False}
    fields.update(extra)
    return RequestRecord(start=start, provider=provider if ok else None, ok=ok, **fields)


def steady(seconds: float, rate: float = 10.0) -> list[float]:
    return [i / rate for i in range(int(seconds * rate))]


def test_demotion_is_when_the_primary_stops_getting_requests() -> None:
    starts = steady(10)
    records = [record(t) for t in starts]
    # Outage from 2 s to 8 s: every request reaches the primary until 4.5 s, then only a
    # probe a second (within the allowed share).
    arrivals = [t for t in starts if t < 4.5] + [5.0, 6.0, 7.0]
    assert demotion_seconds(records, arrivals, 2.0, 8.0) == 2.5
    assert demotion_seconds(records, starts, 2.0, 8.0) is None, "never demoted"
    # A relapse resets it: demoted from 3 s, but sent everything again from 6 s to 6.5 s.
    relapse = [t for t in starts if t < 3.0 or 6.0 <= t < 6.5]
    assert demotion_seconds(records, relapse, 2.0, 8.0) == 4.5


def test_return_is_when_answers_come_from_the_primary_again() -> None:
    records = [record(t, "secondary" if t < 12.0 else "primary") for t in steady(20)]
    assert return_seconds(records, "primary", 10.0) == 2.0
    stuck = [record(t, "secondary") for t in steady(20)]
    assert return_seconds(stuck, "primary", 10.0) is None
    # Failed requests do not count either way.
    mixed = [*records, *(record(t + 0.05, ok=False, status=502) for t in steady(20))]
    assert return_seconds(mixed, "primary", 10.0) == 2.0


def test_summarize_counts_successes_failures_and_extra_calls() -> None:
    records = [
        record(0.0),
        record(0.1, "secondary", ttfb=0.3),
        record(0.2, ok=False, status=502, error="status 502", ttfb=0.01),
        record(0.3, ok=False, status=0, error="timeout", ttfb=None),
    ]
    upstream = {"primary": {"chat_requests": 4}, "secondary": {"chat_requests": 2}}
    summary = summarize(records, upstream, primary="primary")
    assert summary["succeeded"] == 2 and summary["success_rate"] == 0.5
    assert summary["answered_by"] == {"primary": 1, "secondary": 1}
    assert summary["failures"] == {"status 502": 1, "timeout": 1}
    assert summary["upstream_calls"] == 6 and summary["extra_upstream_calls"] == 0.5
    assert summary["ttfb_ms"]["p50"] == 50.0 and summary["ttfb_ms"]["max"] == 300.0
    assert "outage" not in summary
    assert summary["cut_midway"] == 0


def test_a_stream_cut_after_its_first_byte_is_counted_as_such() -> None:
    cut = RequestRecord(0.0, 0.01, 0.2, 200, "primary", True, False, "stream without [DONE]")
    refused = RequestRecord(0.0, 0.01, 0.2, 502, None, True, False, "status 502")
    whole = RequestRecord(0.0, 0.01, 0.2, 200, "primary", True, True, None)
    summary = summarize([cut, refused, whole], {}, primary="primary")
    assert summary["cut_midway"] == 1


def test_cut_streams_rebase_the_success_target_on_what_no_failover_can_save() -> None:
    def result(succeeded: int, cut: int) -> dict[str, Any]:
        base = synthetic_result()
        base["scenarios"]["stream_cut"] = {
            "fault": {"mode": "truncated_stream", "probability": 0.3},
            "summary": {
                **base["scenarios"]["healthy"]["summary"],
                "succeeded": succeeded,
                "success_rate": succeeded / 2000,
                "streamed": 1000,
                "cut_midway": cut,
            },
        }
        return base

    # 13 cut of ~300 a direct caller would have lost: 4.3 %; the other 1987 all answered.
    met = verdicts(result(1987, 13))
    assert met[("stream_cut", "success rate, less streams cut after their first byte")] is True
    assert met[("stream_cut", "streams cut after their first byte")] is True
    assert ("stream_cut", "success rate") not in met
    # 31 cut is over 10 % of 300; one more failure among the savable ones misses 99.9 %.
    missed = verdicts(result(1966, 31))
    assert missed[("stream_cut", "streams cut after their first byte")] is False
    assert missed[("stream_cut", "success rate, less streams cut after their first byte")] is False


def synthetic_result(**scenarios: dict[str, Any]) -> dict[str, Any]:
    def summary(
        ok: int = 2000, calls: int = 2000, p99: float = 100.0, **extra: Any
    ) -> dict[str, Any]:
        return {
            "summary": {
                "requests": 2000,
                "succeeded": ok,
                "success_rate": ok / 2000,
                "upstream_calls": calls,
                "extra_upstream_calls": (calls - 2000) / 2000,
                "ttfb_ms": {"p50": 20.0, "p99": p99},
                **extra,
            }
        }

    return {
        "hedge_delay_s": 0.25,
        "scenarios": {"healthy": summary(), **{k: summary(**v) for k, v in scenarios.items()}},
    }


def verdicts(result: dict[str, Any]) -> dict[tuple[str, str], bool | None]:
    return {(row.scenario, row.name): row.met for row in evaluate(result)}


def test_targets_on_the_boundaries() -> None:
    met = verdicts(synthetic_result(stall={"ok": 1998, "calls": 2200, "p99": 420.0}))
    # (100 ms + 250 ms) x 1.2 = 420 ms; 1998/2000 = 99.9 %; 200 extra calls = 10 %.
    assert met[("stall", "TTFB p99")] is True
    assert met[("stall", "success rate")] is True
    assert met[("stall", "extra upstream calls")] is True
    assert met[("healthy", "success rate")] is True
    assert ("healthy", "TTFB p99") not in met, "the baseline is not judged against itself"

    missed = verdicts(synthetic_result(stall={"ok": 1997, "calls": 2201, "p99": 421.0}))
    assert missed[("stall", "TTFB p99")] is False
    assert missed[("stall", "success rate")] is False
    assert missed[("stall", "extra upstream calls")] is False


def test_outage_targets_and_a_missing_baseline() -> None:
    window = {"start_s": 3.0, "end_s": 13.0}
    quick = {"outage": {**window, "demotion_s": 1.5, "return_s": 4.0}}
    met = verdicts(synthetic_result(outage=quick))
    assert met[("outage", "demotion after the outage starts")] is True
    assert met[("outage", "back on the primary after the outage")] is True

    never = {"outage": {**window, "demotion_s": None, "return_s": None}}
    rows = {(r.scenario, r.name): r for r in evaluate(synthetic_result(outage=never))}
    demotion = rows[("outage", "demotion after the outage starts")]
    assert demotion.met is False and demotion.measured.startswith("never")
    assert rows[("outage", "back on the primary after the outage")].met is False
    slow = {"outage": {**window, "demotion_s": 5.5, "return_s": 30.5}}
    late = verdicts(synthetic_result(outage=slow))
    assert late[("outage", "demotion after the outage starts")] is False
    assert late[("outage", "back on the primary after the outage")] is False

    no_baseline = synthetic_result(stall={})
    del no_baseline["scenarios"]["healthy"]
    assert verdicts(no_baseline)[("stall", "TTFB p99")] is None


def test_records_survive_the_json_round_trip() -> None:
    original = RequestRecord(1.23456, 0.0123456, 0.5, 200, "primary", True, True, None)
    row = json.loads(json.dumps(original.to_row()))
    assert len(row) == len(RECORD_FIELDS)
    again = RequestRecord.from_row(row)
    assert again.provider == "primary" and again.stream and again.ok
    assert again.ttfb == pytest.approx(0.0123456, abs=1e-5)


def test_a_messages_stream_is_read_by_its_events_and_ends_with_message_stop() -> None:
    question = "fault bench run request 5"
    deltas = [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}
        for t in ("Echo: fault bench", " run request 5 [0a1b2c3d4e]")
    ]
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {}},
        *deltas,
        {"type": "message_delta", "delta": {}, "prism": {"resumed": True}},
        {"type": "message_stop"},
    ]
    body = b"".join(
        f"event: {e['type']}\ndata: {json.dumps(e, separators=(',', ':'))}\n\n".encode()
        for e in events
    )
    assert incomplete(body, stream=True, question=question, api="messages") is None
    assert streamed(body) == ("Echo: fault bench run request 5 [0a1b2c3d4e]", True)
    cut = body[: body.index(b"event: message_delta")]
    assert incomplete(cut, stream=True, api="messages") == "stream without message_stop"
    assert incomplete(b'{"stop_reason": "end_turn"}', stream=False, api="messages") is None


def test_a_responses_stream_is_read_by_its_deltas_and_ends_with_response_completed() -> None:
    question = "fault bench run request 7"
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {}},
        {"type": "response.output_text.delta", "delta": "Echo: fault bench"},
        {"type": "response.output_text.delta", "delta": " run request 7 [0a1b2c3d4e]"},
        {"type": "response.completed", "response": {}, "prism": {"resumed": True}},
    ]
    body = b"".join(
        f"event: {e['type']}\ndata: {json.dumps(e, separators=(',', ':'))}\n\n".encode()
        for e in events
    )
    assert incomplete(body, stream=True, question=question, api="responses") is None
    assert streamed(body) == ("Echo: fault bench run request 7 [0a1b2c3d4e]", True)
    cut = body[: body.index(b"event: response.completed")]
    assert incomplete(cut, stream=True, api="responses") == "stream without response.completed"
    assert incomplete(b'{"status": "completed"}', stream=False, api="responses") is None
    assert incomplete(b'{"status": "incomplete"}', stream=False, api="responses") is not None
