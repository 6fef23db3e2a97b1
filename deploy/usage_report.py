"""A project's usage and budget as Redis holds them (origin/governance/usage.py,
origin/governance/budgets.py).

Read-only: one HGETALL per day asked for (pipelined), and the budget's totals for the
current period when the project's policy has one. The origins write their counters
about once a second, so the last second of traffic may not be here yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

import redis

from origin.governance.budgets import budget_keys, period_of
from origin.governance.usage import FIELDS, LAYERS, RETENTION_SECONDS, usage_key
from prism import Budget, Policy, policy_key

__all__ = ["BudgetStatus", "UsageReport", "UsageRow", "parse_since", "read_usage"]

MAX_DAYS = RETENTION_SECONDS // 86_400


@dataclass
class UsageRow:
    day: str
    key_id: str
    model: str
    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LAYERS, 0))
    tokens_in: int = 0
    tokens_out: int = 0
    cost_micros: int = 0
    saved_micros: int = 0
    unpriced: int = 0

    def add(self, counter: str, amount: int) -> None:
        if counter.startswith("requests."):
            layer = counter.removeprefix("requests.")
            self.requests[layer] = self.requests.get(layer, 0) + amount
        elif counter in ("tokens_in", "tokens_out", "cost_micros", "saved_micros", "unpriced"):
            setattr(self, counter, getattr(self, counter) + amount)

    def as_dict(self) -> dict[str, Any]:
        return {
            "day": self.day,
            "key_id": self.key_id,
            "model": self.model,
            "requests": dict(self.requests),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost_usd": self.cost_micros / 1_000_000,
            "saved_usd": self.saved_micros / 1_000_000,
            "unpriced": self.unpriced,
        }


@dataclass
class BudgetStatus:
    budget: Budget
    period: str
    spent_micros: int
    reserved_micros: int

    def as_dict(self) -> dict[str, Any]:
        limit = self.budget.micro_usd
        return {
            "usd": self.budget.usd,
            "period": self.budget.period,
            "current": self.period,
            "spent_usd": self.spent_micros / 1_000_000,
            "reserved_usd": self.reserved_micros / 1_000_000,
            "left_usd": max(limit - self.spent_micros - self.reserved_micros, 0) / 1_000_000,
        }


@dataclass
class UsageReport:
    project: str
    since: date
    until: date
    rows: list[UsageRow]
    budget: BudgetStatus | None

    def totals(self) -> UsageRow:
        total = UsageRow("total", "", "")
        for row in self.rows:
            for layer, count in row.requests.items():
                total.add(f"requests.{layer}", count)
            for name in ("tokens_in", "tokens_out", "cost_micros", "saved_micros", "unpriced"):
                total.add(name, getattr(row, name))
        return total

    def as_dict(self) -> dict[str, Any]:
        totals = self.totals().as_dict()
        for name in ("day", "key_id", "model"):
            del totals[name]
        return {
            "project": self.project,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "rows": [row.as_dict() for row in self.rows],
            "totals": totals,
            "budget": None if self.budget is None else self.budget.as_dict(),
        }


def parse_since(text: str | None, today: date) -> date:
    """``--since``: a UTC day, YYYY-MM-DD, not in the future nor before what is kept;
    ``ValueError`` saying what is wrong. Default: the last 7 days."""
    if text is None:
        return today - timedelta(days=6)
    try:
        since = date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since: {text[:40]!r} is not a date (YYYY-MM-DD)") from None
    if len(text) != 10:
        raise ValueError(f"--since: {text[:40]!r} is not a date (YYYY-MM-DD)")
    if since > today:
        raise ValueError(f"--since: {text} is in the future (today is {today} UTC)")
    if (today - since).days >= MAX_DAYS:
        raise ValueError(f"--since: usage is kept {MAX_DAYS} days; give a later date")
    return since


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_usage(client: redis.Redis, project: str, since: date, now: datetime) -> UsageReport:
    today = now.date()
    days = [since + timedelta(days=i) for i in range((today - since).days + 1)]
    pipe = client.pipeline(transaction=False)
    for day in days:
        pipe.hgetall(usage_key(project, day.isoformat()))
    pipe.get(policy_key(project))
    *hashes, raw_policy = pipe.execute()
    rows: dict[tuple[str, str, str], UsageRow] = {}
    known = set(FIELDS)
    for day, found in zip(days, hashes, strict=True):
        for name, amount in found.items():
            counter, _, rest = _text(name).partition("|")
            key_id, _, model = rest.partition("|")
            if counter not in known:
                continue
            row = rows.get((day.isoformat(), key_id, model))
            if row is None:
                row = rows[(day.isoformat(), key_id, model)] = UsageRow(
                    day.isoformat(), key_id, model
                )
            row.add(counter, int(amount))
    status = None
    if raw_policy is not None:
        try:
            budget = Policy.parse(raw_policy).budget
        except ValueError:
            budget = None
        if budget is not None:
            period, _ = period_of(budget.period, now)
            totals = client.hgetall(budget_keys(project, period)[0])
            spent = int(totals.get(b"spent", totals.get("spent", 0)))
            reserved = int(totals.get(b"reserved", totals.get("reserved", 0)))
            status = BudgetStatus(budget, period, spent, reserved)
    ordered = sorted(rows.values(), key=lambda r: (r.day, r.key_id, r.model))
    return UsageReport(project, since, today, ordered, status)
