"""One view of an instance's workers: their ``/metrics`` and ``/healthz`` merged.

Pure (no I/O): the supervisor's admin listener (``origin.instance.admin``) fetches each
worker's private admin listener and hands the bodies here.

Metrics: every sample is summed over the workers per name and label set (counters,
histograms' buckets, sums and counts, summaries, and gauges that count something held
right now: queue depths, streams in flight). Some gauges are not amounts, and a sum of
them would mean nothing; they take the largest value instead (``MAX_GAUGES``):

- ``prism_origin_event_loop_lag_seconds``: how late one loop ran; the instance is as
  late as its latest worker (a sum of two 50 ms lags is no 100 ms stall anywhere);
- ``prism_provider_state``: a provider's health gate, 0 healthy, 1 probing, 2 demoted;
  each worker keeps its own gate, and the instance shows the worst one;
- any ``*_created`` sample (when a series began, unix seconds): the earliest, so a
  rate over it covers every worker (``min``, the one sample that is not a max);
- info and state-set families: the same in every worker, so the largest is any one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["MAX_GAUGES", "merge_health", "merge_metrics"]

MAX_GAUGES = frozenset({"prism_origin_event_loop_lag_seconds", "prism_provider_state"})
_NOT_AMOUNTS = frozenset({"info", "stateset", "enum"})
_STATES = ("healthy", "probing", "demoted")  # origin.dashboard.figures.STATES, worst last


class _Families:
    """What ``generate_latest`` reads: anything with ``collect``."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge_metrics(texts: Sequence[str], extra: Iterable[Metric] = ()) -> bytes:
    """The workers' exposition texts as one (families in first-seen order), with
    ``extra`` families (the supervisor's own) after them."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
                values[family.name] = {}
            samples = values[family.name]
            combine = _combiner(family.name, family.type)
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                before = samples.get(key)
                if before is None:
                    samples[key] = sample.value
                elif sample.name.endswith("_created"):
                    samples[key] = min(before, sample.value)
                else:
                    samples[key] = combine(before, sample.value)
    for name, merged in families.items():
        merged.samples = [
            Sample(sample, dict(labels), value) for (sample, labels), value in values[name].items()
        ]
    return generate_latest(_Families([*families.values(), *extra]))


def _combiner(name: str, kind: str) -> Any:
    if kind in _NOT_AMOUNTS or (kind == "gauge" and name in MAX_GAUGES):
        return max
    return float.__add__


def merge_health(
    workers: Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None]],
    expected: int,
) -> tuple[bool, dict[str, Any]]:
    """The instance's ``/healthz`` from each worker's (its identity, and its ``/healthz``
    JSON or None when it did not answer). Healthy only if all ``expected`` workers
    answered ``ok``. The top level keeps one origin's shape (``prism top`` and
    ``prism status`` read it): the first answer's, with the worst state of each provider,
    the queues summed and the youngest uptime; every worker's own answer is under
    ``workers``."""
    answers = [body for _, body in workers if body is not None]
    healthy = 0 < len(answers) == expected == len(workers) and all(
        body.get("status") == "ok" for body in answers
    )
    merged: dict[str, Any] = dict(answers[0]) if answers else {}
    merged["status"] = "ok" if healthy else "degraded"
    if answers:
        merged["providers"] = _worst_providers(answers)
        queued = sum(int(_object(body.get("kv_writer")).get("queued") or 0) for body in answers)
        merged["kv_writer"] = {**_object(merged.get("kv_writer")), "queued": queued}
        merged["background_writes"] = sum(
            int(body.get("background_writes") or 0) for body in answers
        )
        merged["uptime_seconds"] = min(float(body.get("uptime_seconds") or 0) for body in answers)
        redis_ok = all(bool(_object(body.get("redis")).get("ok")) for body in answers)
        merged["redis"] = {**_object(merged.get("redis")), "ok": redis_ok}
    merged["workers"] = [
        {**identity, "answered": body is not None, "health": body} for identity, body in workers
    ]
    return healthy, merged


def _worst_providers(answers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    worst: dict[str, Any] = {}
    for body in answers:
        for name, point in _object(body.get("providers")).items():
            if not isinstance(point, dict):
                continue
            held = worst.get(name)
            if held is None or _rank(point) > _rank(held):
                worst[name] = point
    return worst


def _rank(point: Mapping[str, Any]) -> int:
    state = point.get("state")
    return _STATES.index(state) if state in _STATES else len(_STATES)


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
