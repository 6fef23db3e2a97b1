"""Budgets under load, cheaply: admission at 200 concurrent misses, and what a budget adds
to a miss. One process, a private Redis, the provider stand-in and the origin on loopback.

- admission: 200 concurrent misses (distinct bodies) against a budget with room for 10
  reservations, the provider answering after 1 s so every reservation is tried before
  any call settles: how many were admitted (the budget says 10), what was spent against
  the limit, and how long the 200 took.
- miss path: sequential misses (c1) in alternating blocks, without and with a budget:
  median and p90 per miss, end to end over HTTP (client, origin and provider share this
  process, so the difference is the signal, not the absolutes); and the reservation's
  own Redis script timed alone (the settle runs after the answer, off the client's path).

Run it: ``python -m deploy.bench.budget [--misses 200]`` or ``prism bench budget``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import redis

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from origin import Settings, create_app
from origin.app import OriginApp
from origin.connection.redis_pipe import RedisPipe
from origin.governance.budgets import Budgets, budget_keys, period_of
from origin.governance.token_bounds import completion_token_bound, prompt_token_bound
from origin.http.server import listen, server_options
from prism import Budget, Policy, parse_chat_request, parse_key_secrets, policy_key

__all__ = ["main", "run_budget_bench"]

MODEL = "gpt-4o-mini"
CHAT = "/v1/chat/completions"
_SECRET = "bench-key-secret-" + "0" * 16


def _body(text: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1000}


@contextmanager
def _stack(workdir: Path) -> Iterator[tuple[str, OriginApp, ThreadedServer, ProviderServer]]:
    with RedisServer(workdir=workdir) as server, ProviderServer() as provider:
        config = workdir / "providers.toml"
        config.write_text(
            f'[providers.p]\nbase_url = "{provider.url}/v1"\n[models]\n"{MODEL}" = ["p"]\n'
        )
        settings = Settings.from_env(
            {
                "PRISM_KEY_SECRET": _SECRET,
                "PRISM_FORWARD_SECRET": "bench-forward-secret-0123456789",
                "REDIS_URL": server.url,
                "PRISM_PROVIDERS_FILE": str(config),
            }
        )
        sockets = listen("127.0.0.1", 0, "127.0.0.1", 0)
        app = create_app(settings, admin_port=sockets[1].getsockname()[1])
        origin = ThreadedServer(app, **server_options(settings)).start(sockets=sockets)
        try:
            yield server.url, app, origin, provider
        finally:
            origin.stop()


async def _admission(url: str, key: str, n: int) -> list[int]:
    async with httpx.AsyncClient(
        base_url=url,
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
        limits=httpx.Limits(max_connections=n),
    ) as http:
        replies = await asyncio.gather(
            *(http.post(CHAT, json=_body(f"admission {i:05d}")) for i in range(n))
        )
    return [r.status_code for r in replies]


def _misses(url: str, key: str, n: int, admin: redis.Redis, budget: bytes) -> dict[str, Any]:
    """``n`` misses per side, in alternating blocks of 20 so drift hits both alike."""
    times: dict[str, list[float]] = {"no_budget": [], "budget": []}
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}) as http:
        for block in range(0, 2 * n, 20):
            side = "budget" if (block // 20) % 2 else "no_budget"
            if side == "budget":
                admin.set(policy_key("bench"), budget)
            else:
                admin.delete(policy_key("bench"))
            for _ in range(20):
                started = time.perf_counter()
                reply = http.post(CHAT, json=_body(secrets.token_hex(8)))
                times[side].append(time.perf_counter() - started)
                if reply.status_code != 200:
                    raise RuntimeError(f"a miss answered {reply.status_code}: {reply.text[:200]}")
    out: dict[str, Any] = {}
    for side, values in times.items():
        values.sort()
        out[side] = {
            "requests": len(values),
            "p50_ms": round(1000 * statistics.median(values), 3),
            "p90_ms": round(1000 * values[int(0.9 * len(values))], 3),
        }
    out["added_p50_ms"] = round(out["budget"]["p50_ms"] - out["no_budget"]["p50_ms"], 3)
    return out


async def _reserve_alone(redis_url: str, app: OriginApp, n: int) -> dict[str, float]:
    budgets = Budgets(RedisPipe(redis_url), app.gateway.settings.providers)
    chat = parse_chat_request(json.dumps(_body("reserve")))
    budget = Budget(1_000_000, "day")
    reserve, settle = [], []
    for _ in range(n):
        started = time.perf_counter()
        held = await budgets.reserve(
            "bench-alone",
            budget,
            chat.model,
            prompt_token_bound(chat),
            completion_token_bound(chat),
        )
        assert held is not None
        reserve.append(time.perf_counter() - started)
        started = time.perf_counter()
        await budgets.settle(held, 100)
        settle.append(time.perf_counter() - started)
    return {
        "reserve_p50_us": round(1e6 * statistics.median(reserve), 1),
        "settle_p50_us": round(1e6 * statistics.median(settle), 1),
    }


def run_budget_bench(concurrent: int = 200, misses: int = 200) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="prism-bench-budget-") as tmp,
        _stack(Path(tmp)) as (redis_url, app, origin, provider),
    ):
        key = parse_key_secrets(_SECRET).mint("bench")
        admin = redis.Redis.from_url(redis_url)
        chat = parse_chat_request(json.dumps(_body("admission 00000")))
        bound = app.gateway.billing.budgets.bound(
            chat.model, prompt_token_bound(chat), completion_token_bound(chat)
        )
        assert bound is not None
        limit = bound * 10 + bound // 2
        admin.set(policy_key("bench"), Policy(budget=Budget(limit / 1e6, "day")).encode())
        provider.control.set_fault("latency", count=concurrent, ms=1000)
        started = time.perf_counter()
        statuses = asyncio.run(_admission(origin.url, key, concurrent))
        wall = time.perf_counter() - started
        provider.control.clear()
        totals_key = budget_keys("bench", period_of("day", datetime.now(UTC))[0])[0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the settles run just after the answers
            found = admin.hgetall(totals_key).items()
            state = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in found}
            if state.get("reserved", 0) == 0:
                break
            time.sleep(0.05)
        admission = {
            "concurrent": concurrent,
            "budget_room": limit // bound,
            "admitted": statuses.count(200),
            "refused_429": statuses.count(429),
            "other": len(statuses) - statuses.count(200) - statuses.count(429),
            "limit_usd": limit / 1e6,
            "reserve_bound_usd": bound / 1e6,
            "spent_usd": state.get("spent", 0) / 1e6,
            "reserved_after_usd": state.get("reserved", 0) / 1e6,
            "wall_s": round(wall, 3),
        }
        roomy = Policy(budget=Budget(1_000_000, "day")).encode()
        miss_path = _misses(origin.url, key, misses, admin, roomy)
        miss_path["redis_script"] = asyncio.run(_reserve_alone(redis_url, app, 500))
        admin.close()
    return {"admission": admission, "miss_path": miss_path}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrent", type=int, default=200)
    parser.add_argument("--misses", type=int, default=200, help="sequential misses per side")
    args = parser.parse_args(argv)
    print(json.dumps(run_budget_bench(args.concurrent, args.misses), indent=2))


if __name__ == "__main__":
    main()
