"""The origin under each candidate HTTP server, side by side: instructions and wall clock.

    python -m deploy.bench.server_ab [--servers uvicorn,granian,granian-embed,hypercorn]
        [--instructions] [--wall] [--rounds 3] [--seconds 4]

The same app and settings (``create_app`` from the environment, the heap frozen) under:

- ``uvicorn``: today's, ``prism origin serve --workers 1`` itself (httptools, the
  origin's ``DeadlineProtocol`` and options, uvloop);
- ``granian``: granian's ASGI interface as its CLI runs it (one worker process, forked
  from granian's supervisor: the one counted);
- ``granian-st``: the same with its leanest settings (a single-threaded Rust runtime,
  HTTP/1 only);
- ``granian-embed``: granian's embedded ASGI server in our own uvloop (how it would sit
  behind the origin's seam: our supervisor forks the workers, each serves in its loop);
- ``hypercorn``: hypercorn's asyncio server on uvloop.

Candidates that are not installed are skipped, saying so: install them apart from the
project's environment and put them on ``PYTHONPATH`` (e.g. ``pip install --target
/tmp/servers granian hypercorn``, then ``PYTHONPATH=/tmp/servers``).

``--instructions``: each server runs under ``valgrind --tool=callgrind``
(``PYTHONHASHSEED=0``); this process, outside valgrind, sends keep-alive Redis hits (32
connections) and then JSON misses (to the local provider stand-in, in its own process),
asking callgrind for a dump (``callgrind_control -d``) before and after N1 and then N2
requests of each: per request = (instructions of the N2 phase - of the N1 phase) / (N2 -
N1), every thread of the serving process counted (granian's Rust threads too). The
client's own work is not counted; the in-process drivers (``hit_driver``,
``miss_driver``) give the app's share without a server.

``--wall``: every candidate serves at once (no valgrind); rounds alternate the order,
each row for ``--seconds`` with the project's load generator (wrk, else its Python
client) at concurrency 1 and 32: requests a second, p50, and the serving process's CPU
per request from /proc (steadier than the rate on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from deploy.local.ports import free_port
from deploy.local.redis import RedisServer
from prism import headers as h
from prism import parse_key_secrets
from prism.routes import CHAT_PATH

from .http1 import Connection, build_request
from .loadgen import UNIQUE, LoadSpec, run_load
from .miss_driver import provider_process
from .workload import chat_body

__all__ = ["SERVERS", "available", "main", "origin_app", "run"]

# Each candidate: the module it needs (None: the project's own).
SERVERS: dict[str, str | None] = {
    "uvicorn": None,
    "granian": "granian",
    "granian-st": "granian",
    "granian-embed": "granian",
    "hypercorn": "hypercorn",
}
_KEY_SECRET = "bench-server-ab-key-secret-0123456789"
_PROJECT = "bench"
_HIT_COUNTS = (400, 1200)  # N1, N2 hits under valgrind
_MISS_COUNTS = (64, 192)  # N1, N2 JSON misses under valgrind
_WARM_HITS = 200
_WARM_MISSES = 64
_CONCURRENCY = 32


def origin_app() -> Any:
    """The origin's app from the environment, its heap frozen (granian's factory)."""
    from origin import Settings, create_app
    from origin.http.server import freeze_heap

    app = create_app(Settings.from_env())
    freeze_heap()
    return app


def _serve(server: str, port: int) -> None:
    """Serve the origin under ``server`` on ``port`` until SIGINT or SIGTERM."""
    if server in ("granian", "granian-st"):
        import multiprocessing

        constants, log = _optional("granian.constants"), _optional("granian.log")
        # Its leanest ASGI set-up: a single-threaded Rust runtime, HTTP/1 only (no sniffing).
        tuned: dict[str, Any] = {}
        if server == "granian-st":
            tuned = {"runtime_mode": constants.RuntimeModes.st, "http": constants.HTTPModes.http1}
        # Spawned, not forked: valgrind (``--trace-children``) then counts the worker as a
        # process of its own that ``callgrind_control`` can reach (a forked one it cannot).
        multiprocessing.set_start_method("spawn")
        _optional("granian").Granian(
            "deploy.bench.server_ab:origin_app", address="127.0.0.1", port=port,
            interface=constants.Interfaces.ASGI, workers=1, factory=True,
            log_level=log.LogLevels.warning, **tuned,
        ).serve()  # fmt: skip
        return
    import uvloop

    uvloop.run(_serve_async(server, port))


async def _serve_async(server: str, port: int) -> None:
    app = origin_app()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, stop.set)
    if server == "granian-embed":
        constants, log = _optional("granian.constants"), _optional("granian.log")
        embedded = _optional("granian.server.embed").Server(
            app, address="127.0.0.1", port=port, interface=constants.Interfaces.ASGI,
            log_level=log.LogLevels.warning,
        )  # fmt: skip
        serving = asyncio.ensure_future(embedded.serve())
        await stop.wait()
        embedded.stop()
        await serving
        return
    config = _optional("hypercorn.config").Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.loglevel = "WARNING"
    config.keep_alive_max_requests = 1 << 30  # as the others: a connection is never cut
    await _optional("hypercorn.asyncio").serve(app, config, shutdown_trigger=stop.wait)


def _optional(name: str) -> Any:
    """A candidate's module: not a dependency of the project, so typed as Any."""
    return importlib.import_module(name)


def _server_env(redis_url: str, provider_url: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PRISM_KEY_SECRET": _KEY_SECRET,
        "PRISM_FORWARD_SECRET": _KEY_SECRET,
        "REDIS_URL": redis_url,
        "OPENAI_BASE_URL": provider_url + "/v1",
        "OPENAI_API_KEY": "bench",
        "PYTHONHASHSEED": "0",
        # Under valgrind a turn of the loop is 50 x slower: no deadline may fire, and the
        # loop's lag must not shed requests (set alike for the wall clock: same settings).
        "PRISM_REDIS_TIMEOUT": "60",
        "PRISM_READ_TIMEOUT": "600",
        "PRISM_LOOP_LAG_LIMIT": "0",
    }
    env.pop("PRISM_PROVIDERS_FILE", None)
    return env


def _command(server: str, port: int) -> list[str]:
    if server == "uvicorn":  # today's serving path, exactly
        admin = str(free_port())
        serve = ["origin", "serve", "--port", str(port), "--admin-port", admin]
        return [sys.executable, "-m", "deploy.cli", *serve, "--workers", "1"]
    return [sys.executable, "-m", "deploy.bench.server_ab", "--serve", server, "--port", str(port)]


@dataclass(slots=True)
class Served:
    """One candidate serving the origin in its own process group."""

    server: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serving_pid(self) -> int:
        """The process that runs the app: granian's (only) worker, else the one started."""
        if self.server not in ("granian", "granian-st"):
            return self.process.pid
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        found = [  # not multiprocessing's resource tracker, its other child
            pid
            for pid in children.read_text().split()
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        if len(found) != 1:
            raise RuntimeError(f"granian should have one worker, has {found}")
        return int(found[0])

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=120)  # valgrind writes its files on the way out
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _start(server: str, env: dict[str, str], prefix: Sequence[str] = ()) -> Served:
    port = free_port()
    process = subprocess.Popen(
        [*prefix, *_command(server, port)], env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    served = Served(server, port, process)
    deadline = time.monotonic() + 300  # valgrind starts an interpreter slowly
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{server} exited at start ({process.returncode})")
        try:
            httpx.get(served.url + "/healthz", timeout=5)
            return served
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                served.stop()
                raise RuntimeError(f"{server} did not start in time") from None
            time.sleep(0.2)


@dataclass(frozen=True, slots=True)
class Workload:
    """The requests: one planted hit, and a template whose every copy misses."""

    auth: str
    hit_body: bytes
    miss_template: str

    @classmethod
    def make(cls) -> Workload:
        key = parse_key_secrets(_KEY_SECRET).mint(_PROJECT)
        return cls(f"Bearer {key}", chat_body("server-ab").encode(), chat_body(UNIQUE))

    def request(self, port: int, body: bytes) -> bytes:
        headers = {"authorization": self.auth, "content-type": "application/json"}
        return build_request("POST", "127.0.0.1", port, CHAT_PATH, headers, body)

    def plant(self, url: str) -> None:
        """The hit body answered once by the provider, then until Redis serves it."""
        headers = {"authorization": self.auth, "content-type": "application/json"}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            reply = httpx.post(url + CHAT_PATH, content=self.hit_body, headers=headers, timeout=60)
            if reply.headers.get(h.CACHE_LAYER) == "redis":
                return
            time.sleep(0.2)
        raise RuntimeError("the hit entry was never served from Redis")


async def _send(
    connections: list[Connection], requests: Iterator[bytes], count: int, layer: str
) -> None:
    """``count`` requests, one per connection at a time; each must be a 200 from ``layer``."""

    async def one(connection: Connection) -> None:
        reply = await connection.send(next(requests))
        if reply.status != 200 or reply.headers.get(h.CACHE_LAYER) != layer:
            raise RuntimeError(f"not a {layer}: {reply.status} {reply.body[:200]!r}")

    done = 0
    while done < count:
        batch = min(len(connections), count - done)
        await asyncio.gather(*(one(c) for c in connections[:batch]))
        done += batch


def _dump(pid: int, folder: Path) -> int:
    """Ask callgrind for a dump now; the instructions counted since the last one."""
    before = set(folder.glob(f"cg.{pid}.*"))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for path in set(folder.glob(f"cg.{pid}.*")) - before:
            text = path.read_text(errors="replace")
            for line in reversed(text.splitlines()):
                if line.startswith(("totals:", "summary:")):
                    return int(line.split()[1])
        time.sleep(0.1)
    raise RuntimeError("callgrind wrote no dump")


def measure_instructions(
    server: str, env: dict[str, str], work: Workload, keep: Path | None = None
) -> dict[str, float]:
    """Instructions per Redis hit and per JSON miss of the process serving under ``server``;
    callgrind's files are left in ``keep/server`` if given (for ``callgrind_annotate``)."""
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name) if keep is None else keep / server
        folder.mkdir(parents=True, exist_ok=True)
        valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/cg.%p"]
        valgrind += ["--trace-children=yes"]  # only granian has children: its worker
        served = _start(server, env, valgrind)
        try:
            work.plant(served.url)
            pid = served.serving_pid()
            return asyncio.run(_count(served, pid, folder, work))
        finally:
            served.stop()


async def _count(served: Served, pid: int, folder: Path, work: Workload) -> dict[str, float]:
    connections = [await Connection.open("127.0.0.1", served.port) for _ in range(_CONCURRENCY)]
    hit = work.request(served.port, work.hit_body)
    nonce = uuid.uuid4().hex[:12]
    misses = (
        work.request(served.port, work.miss_template.replace(UNIQUE, f"{nonce}-{i}").encode())
        for i in range(1 << 30)
    )
    hits = iter(lambda: hit, None)
    result: dict[str, float] = {}
    try:
        for row, requests, layer, warm, (n1, n2) in (
            ("hit", hits, "redis", _WARM_HITS, _HIT_COUNTS),
            ("miss", misses, "miss", _WARM_MISSES, _MISS_COUNTS),
        ):
            await _send(connections, requests, warm, layer)
            await asyncio.to_thread(_dump, pid, folder)  # start-up and warm-up: not counted
            await _send(connections, requests, n1, layer)
            first = await asyncio.to_thread(_dump, pid, folder)
            await _send(connections, requests, n2, layer)
            second = await asyncio.to_thread(_dump, pid, folder)
            result[row] = (second - first) / (n2 - n1)
    finally:
        for connection in connections:
            await connection.close()
    return result


@dataclass(frozen=True, slots=True)
class Usage:
    """A process's CPU so far (user and system seconds) and its context switches, every
    thread's: a server that hands each request between threads pays in the kernel."""

    user: float
    system: float
    switches: int

    @classmethod
    def of(cls, pid: int) -> Usage:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        switches = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                for line in (task / "status").read_text().splitlines():
                    if "ctxt_switches:" in line:  # voluntary and not
                        switches += int(line.split()[1])
        return cls(int(fields[11]) / tick, int(fields[12]) / tick, switches)

    def per_request(self, before: Usage, requests: int) -> dict[str, float]:
        count = max(requests, 1)
        return {
            "cpu_us": round(
                (self.user + self.system - before.user - before.system) / count * 1e6, 1
            ),
            "sys_us": round((self.system - before.system) / count * 1e6, 1),
            "switches": round((self.switches - before.switches) / count, 2),
        }


def measure_wall(
    servers: list[str], env: dict[str, str], work: Workload, rounds: int, seconds: float
) -> list[dict[str, Any]]:
    """Rows of rps, p50 and CPU per request, every candidate each round (order alternating)."""
    started = [_start(server, env) for server in servers]
    results: list[dict[str, Any]] = []
    try:
        for served in started:
            work.plant(served.url)
        headers = {"authorization": work.auth, "content-type": "application/json"}
        for number in range(rounds):
            order = started if number % 2 == 0 else started[::-1]
            for served in order:
                pid = served.serving_pid()
                for row, body, concurrency in (
                    ("hit", work.hit_body.decode(), 1),
                    ("hit", work.hit_body.decode(), 32),
                    ("miss", work.miss_template, 1),
                    ("miss", work.miss_template, 32),
                ):
                    spec = LoadSpec(
                        served.url + CHAT_PATH, concurrency, seconds, body=body,
                        headers=headers, nonce=f"{served.server}-{number}-{uuid.uuid4().hex[:6]}",
                    )  # fmt: skip
                    before = Usage.of(pid)
                    load = run_load(spec)
                    used = Usage.of(pid).per_request(before, load.requests)
                    results.append({
                        "server": served.server, "round": number, "row": row,
                        "concurrency": concurrency, "rps": round(load.rps),
                        "p50_ms": round(load.p50_ms, 3), "non_2xx": load.non_2xx + load.errors,
                        **used,
                        "loadgen_cpu_s": round(load.loadgen_cpu_s, 2),
                    })  # fmt: skip
                    print(json.dumps(results[-1]), flush=True)
    finally:
        for served in started:
            served.stop()
    return results


def available(servers: Sequence[str]) -> list[str]:
    """Those of ``servers`` whose module is installed (the others skipped, saying so)."""
    kept = []
    for server in servers:
        needs = SERVERS[server]
        if needs is not None and importlib.util.find_spec(needs) is None:
            print(f"skipped {server}: {needs} is not installed (see --help)", file=sys.stderr)
            continue
        kept.append(server)
    return kept


def run(
    servers: Sequence[str],
    *,
    instructions: bool = False,
    wall: bool = False,
    rounds: int = 3,
    seconds: float = 4.0,
    keep: Path | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Measure the installed ``servers`` on their own Redis and provider; each figure is
    printed as a JSON line as it comes, and all are returned."""
    servers = available(servers)
    work = Workload.make()
    report: dict[str, list[dict[str, Any]]] = {"instructions": [], "wall": []}
    with (
        tempfile.TemporaryDirectory() as folder,
        RedisServer(workdir=Path(folder)) as redis,
        provider_process() as provider_url,
    ):
        env = _server_env(redis.url, provider_url)
        if instructions:
            for server in servers:
                counted = measure_instructions(server, env, work, keep)
                report["instructions"].append(
                    {"server": server, **{row: round(n) for row, n in counted.items()}}
                )
                print(json.dumps(report["instructions"][-1]), flush=True)
        if wall:
            report["wall"] = measure_wall(servers, env, work, rounds, seconds)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--instructions", action="store_true", help="callgrind per request")
    parser.add_argument("--wall", action="store_true", help="requests a second, interleaved")
    parser.add_argument("--keep", type=Path, help="leave callgrind's files in KEEP/SERVER")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--serve", choices=sorted(SERVERS), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:  # the child: serve the origin under one candidate
        _serve(args.serve, args.port)
        return
    servers = args.servers.split(",")
    unknown = set(servers) - set(SERVERS)
    if unknown:
        parser.error(f"unknown servers {sorted(unknown)}; choose from {sorted(SERVERS)}")
    if not (args.instructions or args.wall):
        parser.error("say what to measure: --instructions, --wall or both")
    run(
        servers, instructions=args.instructions, wall=args.wall, rounds=args.rounds,
        seconds=args.seconds, keep=args.keep,
    )  # fmt: skip


if __name__ == "__main__":
    main()
