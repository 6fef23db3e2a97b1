"""The stack of one `prism bench` run, on loopback: everything a row is measured against.

The local stack (Redis, demo provider, origin, the Workers runtime with the edge, the KV
REST stand-in, the trivial floor Worker and the forwarding Worker), the floor ASGI apps
(one per Redis client), and a constant Node HTTP server that shows the load generator's
own ceiling; then a planted cache entry, and one request down every path to prove a
"hit" is a hit. Apart from ``deploy.bench.runner`` (which drives the load and collects
the rows) because bringing the parts up and down is a concern of its own: the runner
only reads the ``BenchContext`` it gets.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from deploy.local.ports import free_port
from deploy.local.stack import LocalStack, StackConfig, StackInfo
from deploy.local.workers import ExtraWorker, find_node_toolchain
from prism import headers as h
from prism import parse_key_secrets

from .ladder import ladder_worker
from .loadgen import UNIQUE
from .servers import BenchError, HelperServer
from .workload import CHAT_PATH, chat_body, plant_entry

__all__ = ["FORWARD_WORKER", "KV_FLUSH", "TRIVIAL_WORKER", "BenchContext", "BenchStack", "Step"]

TRIVIAL_WORKER = Path(__file__).with_name("workers") / "trivial"
FORWARD_WORKER = Path(__file__).with_name("workers") / "forward"
# Replies padded to about 1 KB, a typical short completion.
_PROVIDER_ARGS = ("--reply-words", "150")
_NODE_CEILING = (
    "const http=require('http');"
    "http.createServer((q,s)=>{q.resume();q.on('end',()=>{s.writeHead(200,"
    "{'content-type':'application/json'});s.end('{\"ok\":true}')})})"
    ".listen(+process.argv[1],'127.0.0.1')"
)
KV_FLUSH = 1.0  # the KV writer's production flush interval (prism dev uses 0.1 s)
_SCRUBBED_ENV = (
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PRISM_PROVIDERS_FILE", "REDIS_URL", "PRISM_REDIS_URL",
)  # fmt: skip

_FLOOR_KEY = "prism-bench:floor"
_STACK_PARTS = ("origin", "provider", "workers runtime")

Step = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class BenchContext:
    """What every phase needs: where things are, who they are, what to send."""

    info: StackInfo
    urls: Mapping[str, str]  # trivial, floor, floor_redis_py, ceiling, provider
    pids: Mapping[str, int]  # origin, provider, workers runtime, floors, ceiling
    auth: Mapping[str, str]
    bad: Mapping[str, str]  # the same headers with a forged key
    hit_body: str
    hit_key: str  # the planted entry's Redis / KV key
    miss_body: str


class BenchStack:
    """``start()`` brings the bench's stack up and plants its entries, ``check_paths()``
    proves every path answers as expected, ``stop()`` takes it down. ``state`` (logs,
    the stack's files) is the caller's to remove."""

    def __init__(self, state: Path, nonce: str, *, ladder: bool, on_step: Step) -> None:
        self._state = state
        self._nonce = nonce
        self._ladder = ladder  # the profile's edge ladder Worker too
        self._on_step = on_step
        self._stack: LocalStack | None = None
        self._children: list[HelperServer] = []
        # Fresh secrets each run, handed to the stack, so nothing of `prism dev`'s is reused.
        self._secrets = {
            "PRISM_KEY_SECRET": secrets.token_urlsafe(32),
            "PRISM_FORWARD_SECRET": secrets.token_urlsafe(32),
            "PRISM_LOCAL_API_TOKEN": secrets.token_urlsafe(24),
        }

    def start(self) -> BenchContext:
        info, urls = self._start()
        assert self._stack is not None
        planted = plant_entry(
            project=info.project,
            provider_url=urls["provider"],
            redis_url=info.redis_url,
            kv_bulk_url=f"{info.kv_api_url}/accounts/local/storage/kv/namespaces/prism-local/bulk",
            kv_token=self._secrets["PRISM_LOCAL_API_TOKEN"],
        )
        # The floor app reads the same envelope from its own key.
        with contextlib.closing(redis.Redis.from_url(info.redis_url)) as client:
            client.set(_FLOOR_KEY, planted.envelope)
        auth = {"content-type": "application/json", "authorization": f"Bearer {info.api_key}"}
        # Well-formed, right project and key id, signed with another secret: only the
        # signature check can reject it.
        forged = parse_key_secrets("not-" + secrets.token_hex(16)).mint(
            info.project, key_id="devkey0000000001"
        )
        return BenchContext(
            info=info,
            urls=urls,
            pids={name: self._stack.pid(name) or 0 for name in _STACK_PARTS}
            | {child.name: child.pid for child in self._children},
            auth=auth,
            bad=auth | {"authorization": f"Bearer {forged}"},
            hit_body=planted.body,
            hit_key=planted.key,
            miss_body=chat_body(UNIQUE),
        )

    def stop(self) -> None:
        for child in reversed(self._children):
            child.stop()
        self._children.clear()
        if self._stack is not None:
            self._stack.stop()
            self._stack = None

    def _start(self) -> tuple[StackInfo, dict[str, str]]:
        self._on_step("starting the stack (Redis, provider, origin, Workers runtime)")
        logs = self._state / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        urls: dict[str, str] = {}
        # The ceiling first: the ladder Worker's fetch probe is pointed at it.
        port = free_port()
        node = find_node_toolchain().node
        self._children.append(
            HelperServer("ceiling", [str(node), "-e", _NODE_CEILING, str(port)], logs / "ceil.log")
        )
        urls["ceiling"] = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV} | self._secrets
        origin_port = free_port()
        workers = [
            ExtraWorker("trivial", TRIVIAL_WORKER, kv_binding="PRISM_KV"),
            ExtraWorker(
                "forward", FORWARD_WORKER, vars={"ORIGIN_URL": f"http://127.0.0.1:{origin_port}"}
            ),
        ]
        if self._ladder:
            edge_secrets = {
                name: self._secrets[name] for name in ("PRISM_KEY_SECRET", "PRISM_FORWARD_SECRET")
            }
            workers.append(ladder_worker(self._state / "ladder", edge_secrets, urls["ceiling"]))
        self._stack = LocalStack(
            StackConfig(
                state_dir=self._state,
                origin_port=origin_port,
                edge_port=0,
                kv_api_port=0,
                env=env,
                kv_flush_interval=KV_FLUSH,
                extra_workers=tuple(workers),
                provider_args=_PROVIDER_ARGS,
                # PRISM_REQUEST_LOG=off turns the edge's records off too, for an A/B of them.
                edge_env={
                    name: os.environ[name] for name in ("PRISM_REQUEST_LOG",) if name in os.environ
                },
            )
        )
        info = self._stack.start()
        urls.update(self._stack.extra_urls)
        for name, client in (("floor", "pipe"), ("floor_redis_py", "redis-py")):
            port = free_port()
            self._children.append(
                HelperServer(
                    name,
                    [sys.executable, "-m", "deploy.bench.floor_app", "--port", str(port),
                     "--redis-url", info.redis_url, "--key", _FLOOR_KEY, "--client", client],
                    logs / f"{name}.log",
                )
            )  # fmt: skip
            urls[name] = f"http://127.0.0.1:{port}"
        urls["provider"] = next(c.url for c in info.components if c.name == "provider")
        self._on_step("planting cache entries and checking every path answers as expected")
        for child in self._children:
            child.wait_ready(urls[child.name])
        return info, urls

    def check_paths(self, ctx: BenchContext) -> dict[str, Any]:
        """One request per path: the numbers mean nothing if a "hit" was not a hit."""
        chat, info, hit, auth = CHAT_PATH, ctx.info, ctx.hit_body, ctx.auth
        miss = chat_body(f"check-{self._nonce}")
        with httpx.Client(timeout=30) as http:
            edge_hit = http.post(info.edge_url + chat, content=hit, headers=auth)
            origin_hit = http.post(info.origin_url + chat, content=hit, headers=auth)
            origin_miss = http.post(info.origin_url + chat, content=miss, headers=auth)
            bad_key = http.post(info.edge_url + chat, content=hit, headers=ctx.bad)
            others = [
                http.post(ctx.urls[name] + chat, content=hit, headers=auth)
                for name in ("trivial", "forward", "floor", "floor_redis_py", "provider")
            ]
        checks = {
            "edge_hit": edge_hit.headers.get(h.CACHE_LAYER),
            "edge_hit_timing": edge_hit.headers.get(h.SERVER_TIMING, ""),
            "origin_hit": origin_hit.headers.get(h.CACHE_LAYER),
            "origin_miss": origin_miss.headers.get(h.CACHE_LAYER),
            "bad_key": bad_key.status_code,
        }
        problems = [
            f"{what} answered {got}"
            for what, got, want in (
                ("edge hit", (edge_hit.status_code, checks["edge_hit"]), (200, "kv")),
                ("origin hit", (origin_hit.status_code, checks["origin_hit"]), (200, "redis")),
                ("origin miss", (origin_miss.status_code, checks["origin_miss"]), (200, "miss")),
                ("bad key", bad_key.status_code, 401),
                ("floors", [r.status_code for r in others], [200] * 5),
            )
            if got != want
        ]
        if problems:
            raise BenchError("path check failed: " + "; ".join(problems))
        return checks
