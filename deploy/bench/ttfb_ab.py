"""A streamed miss's time to first byte: this checkout's origin against a base commit's.

    python -m deploy.bench.ttfb_ab [--base 4a053f0] [--current PATH] [--rounds 10]
        [--requests 600] [--warmup 50] [--current-env NAME=VALUE] [--json]

Three targets, each answered by the same local provider stand-in (``deploy.local.provider``:
no delay, a short fixed answer in 8 chunks, in a process of its own so that it never takes
the client's GIL):

- ``base``: the origin of ``--base`` (default 4a053f0, the first wave's last commit), checked
  out into a temporary ``git worktree add --detach`` (removed afterwards);
- ``current``: the origin of this checkout (or ``--current PATH``), with whatever compiled
  (mypyc) modules it has in place: the report says which it loaded;
- ``floor``: the provider itself, asked directly.

Each origin is started as its tree's own ``prism origin serve`` (with ``--workers 1`` and a
free ``--admin-port`` where its command has them: the first wave's has neither), with
this process's interpreter and venv, cwd and ``PYTHONPATH`` its tree, so the tree's own code
is imported; both on one private redis-server, configured with exactly the variables both
read (``PRISM_KEY_SECRET``, ``PRISM_FORWARD_SECRET``, ``REDIS_URL``, ``OPENAI_BASE_URL``,
``OPENAI_API_KEY``; every other ``PRISM_*`` of ours left out: each runs with its defaults);
its API key minted by the tree's own ``prism keys mint``.

The load is at concurrency 1: streamed chat requests (the ~2 KB body of ``workload``), each
with a message of its own, so each is a miss (checked: status 200, layer ``miss``, the stream
ended by ``[DONE]``), on one blocking keep-alive socket per target and round (opened before
its first request, so the connect is not timed). The time to first byte runs
from just before the request is written to the arrival of the first body chunk that holds
an SSE ``data:`` line. After a warm-up of every target, rounds alternate base, current,
floor, ``--requests`` each; per round and target: p50 and p90, and the origin's CPU per
request (``/proc``, user + system: the steadier figure on a busy machine). The medians over
rounds give ``current - floor`` and ``current - base`` (also the median of each round's own
difference, the least touched by load from elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.local.ports import free_port
from deploy.local.processes import ChildProcess
from deploy.local.redis import RedisServer
from prism import headers as h
from prism.routes import CHAT_PATH

from .http1 import build_request, split_url
from .loadgen import percentile
from .machine import cpu_seconds, load_average, machine_info
from .miss_driver import provider_process
from .workload import chat_body

__all__ = ["BASE_COMMIT", "TARGETS", "BaseTreeUnavailable", "StreamClient", "main", "run"]

BASE_COMMIT = "4a053f0"  # the first wave's last commit (2026-11-29)
TARGETS = ("base", "current", "floor")  # the order of every round
_CHECKOUT = Path(__file__).resolve().parents[2]
_KEY_SECRET = "bench-ttfb-ab-key-secret-0123456789"
_FORWARD_SECRET = "bench-ttfb-ab-forward-secret-0123"
_PROJECT = "bench"
# Our own settings must not reach either origin: each runs with its defaults.
_OURS = ("PRISM_", "OTEL_", "OPENAI_", "ANTHROPIC_", "REDIS_URL", "PYTHONPATH")
_STREAM_END = b"data: [DONE]"
_TIMEOUT = 30.0  # seconds a socket waits for a reply before the request counts as failed


class BaseTreeUnavailable(RuntimeError):
    """The base commit cannot be checked out here (no git, no such commit, a shallow clone)."""


@contextmanager
def base_worktree(commit: str, repository: Path = _CHECKOUT) -> Iterator[Path]:
    """``commit`` checked out (detached) in a temporary worktree of ``repository``."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(repository), *args], capture_output=True, text=True)

    with tempfile.TemporaryDirectory(prefix="ttfb-ab-") as folder:
        tree = Path(folder) / "base"
        try:
            added = git("worktree", "add", "--detach", str(tree), commit)
        except OSError as error:  # no git at all
            raise BaseTreeUnavailable(f"git cannot run: {error}") from None
        if added.returncode != 0:
            raise BaseTreeUnavailable(f"git worktree add {commit}: {added.stderr.strip()}")
        try:
            yield tree
        finally:
            git("worktree", "remove", "--force", str(tree))
            git("worktree", "prune")  # in case the removal left its record behind


@dataclass(frozen=True, slots=True)
class Tree:
    """A checkout an origin runs from: its code imported from ``root`` alone."""

    name: str
    root: Path

    def env(self, redis_url: str, provider_url: str) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items() if not name.startswith(_OURS)}
        return {
            **env,
            "PYTHONPATH": str(self.root),
            "PRISM_KEY_SECRET": _KEY_SECRET,
            "PRISM_FORWARD_SECRET": _FORWARD_SECRET,
            "REDIS_URL": redis_url,
            "OPENAI_BASE_URL": provider_url + "/v1",
            "OPENAI_API_KEY": "bench",
        }

    def python(self, env: dict[str, str], *args: str) -> str:
        """The output of this tree's Python ``args`` (cwd the tree: its code is imported)."""
        done = subprocess.run(
            [sys.executable, *args], cwd=self.root, env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(args)} failed:\n{done.stderr[-2000:]}")
        return done.stdout

    def mint_key(self, env: dict[str, str]) -> str:
        """An API key from the tree's own ``prism keys mint`` (its own key format)."""
        out = self.python(env, "-m", "deploy.cli", "keys", "mint", "--project", _PROJECT, "--json")
        return str(json.loads(out)["key"])

    def loaded(self, env: dict[str, str]) -> dict[str, Any]:
        """Where the tree's origin is imported from, which of its modules are compiled
        (extension modules) as its ``prism origin serve`` imports them, and which of those
        look stale (their ``.py`` newer than the ``.so``: a build from older code)."""
        probe = (
            "import json, sys, origin\n"
            "from origin import Settings, create_app\n"  # a lazy package: what serve loads
            "compiled = sorted(n for n, m in list(sys.modules.items())\n"
            "    if n.split('.')[0] in ('origin', 'prism')\n"
            "    and (getattr(m, '__file__', None) or '').endswith('.so'))\n"
            "print(json.dumps({'origin': origin.__file__, 'compiled': compiled}))"
        )
        found = json.loads(self.python(env, "-c", probe))

        def built(name: str) -> float:  # mypyc names a wrong __file__: found by its name
            source = self.root / name.replace(".", "/")
            extensions = source.parent.glob(source.name + ".*.so")
            return max((path.stat().st_mtime for path in extensions), default=0.0)

        # A group's code is in its library (``prism/_compiled__mypyc*.so``); a module's own
        # extension is a shim, left as it was when a rebuild did not change it.
        group = max(
            (built(name) for name in found["compiled"] if name.endswith("__mypyc")), default=0.0
        )
        stale = []
        for name in found["compiled"]:
            source = self.root / (name.replace(".", "/") + ".py")
            if source.exists() and source.stat().st_mtime > max(built(name), group):
                stale.append(name)
        return {**found, "stale": stale}

    def commit(self) -> str:
        done = subprocess.run(
            ["git", "-C", str(self.root), "describe", "--always", "--dirty"],
            capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout.strip() or "unknown"

    def serve_command(self, port: int) -> list[str]:
        """The tree's ``prism origin serve``, with only the options its command has."""
        command = [sys.executable, "-m", "deploy.cli", "origin", "serve", "--port", str(port)]
        source = (self.root / "deploy" / "commands" / "origin.py").read_text()
        if "admin_port" in source:  # later: an admin listener (default 9090: give each its own)
            command += ["--admin-port", str(free_port())]
        if "workers" in source:  # later: default a worker per core; one, as the first wave
            command += ["--workers", "1"]
        return command


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    layer: str | None
    ttfb: float  # seconds to the first body chunk with an SSE data line (0: none came)
    whole: bool  # the stream ended with [DONE]


class StreamClient:
    """One keep-alive HTTP/1.1 connection on a blocking socket: the same lean client for
    every target, reading a chunked stream as it comes."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._sock = socket.create_connection((host, port), timeout=_TIMEOUT)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    def close(self) -> None:
        self._sock.close()

    def _until(self, mark: bytes) -> bytes:
        while (end := self._buffer.find(mark)) < 0:
            self._receive()
        found, self._buffer = self._buffer[: end + len(mark)], self._buffer[end + len(mark) :]
        return found

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._receive()
        found, self._buffer = self._buffer[:size], self._buffer[size:]
        return found

    def _receive(self) -> None:
        data = self._sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self._buffer += data

    def post(self, path: str, headers: dict[str, str], body: bytes) -> Answer:
        request = build_request("POST", self.host, self.port, path, headers, body)
        started = time.perf_counter()
        self._sock.sendall(request)
        status_line, *header_lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        fields = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        first, text = 0.0, b""
        if fields.get("transfer-encoding", "").lower() == "chunked":
            while size := int(self._until(b"\r\n").split(b";", 1)[0], 16):
                chunk = self._exactly(size + 2)[:-2]
                if not first and b"data:" in chunk:
                    first = time.perf_counter()
                text = (text + chunk)[-64:]  # only the end is checked
            self._until(b"\r\n")  # no trailers: the empty line that ends the body
        else:
            text = self._exactly(int(fields.get("content-length", "0")))
        status = int(status_line.split(" ", 2)[1])
        whole = _STREAM_END in text
        return Answer(status, fields.get(h.CACHE_LAYER), first - started if first else 0.0, whole)


@dataclass(slots=True)
class Target:
    """One target: where it listens, what it is asked, the cache layer its answers must
    name, and the process to count the CPU of."""

    name: str
    url: str  # http://host:port
    authorization: str
    layer: str | None  # an origin's "miss"; the provider names none
    pid: int | None  # the origin's process (None: the provider, not counted)
    client: StreamClient | None = None
    failure: str = ""  # why the last failed request failed

    def ask(self, tag: str) -> Answer | None:
        """One streamed miss; None if it failed (the connection is then opened again)."""
        host, port, _ = split_url(self.url)
        headers = {
            "authorization": self.authorization,
            "content-type": "application/json",
            "accept": "text/event-stream",
        }
        body = chat_body(tag, stream=True).encode()
        try:
            if self.client is None:
                self.client = StreamClient(host, port)
            answer = self.client.post(CHAT_PATH, headers, body)
        except OSError as error:
            self.hang_up()
            self.failure = repr(error)
            return None
        if (
            answer.status != 200
            or answer.layer != self.layer
            or not answer.whole
            or not answer.ttfb
        ):
            self.failure = f"status {answer.status}, layer {answer.layer}, whole {answer.whole}"
            return None
        return answer

    def hang_up(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def _round(target: Target, requests: int, tag: str) -> dict[str, Any]:
    cpu_before = cpu_seconds(target.pid) if target.pid else 0.0
    ttfbs = []
    for number in range(requests):
        answer = target.ask(f"{tag}-{number}")
        if answer is not None:
            ttfbs.append(answer.ttfb * 1000)
    # Idle through the other targets' rounds, a connection would outlive the server's
    # keep-alive timeout (uvicorn's 5 s) and fail the next round's first request.
    target.hang_up()
    ttfbs.sort()
    row: dict[str, Any] = {
        "requests": requests,
        "answered": len(ttfbs),
        "ttfb_p50_ms": round(percentile(ttfbs, 50), 3) if ttfbs else None,
        "ttfb_p90_ms": round(percentile(ttfbs, 90), 3) if ttfbs else None,
    }
    if target.pid:
        cpu = cpu_seconds(target.pid) - cpu_before
        row["cpu_us_per_request"] = round(1e6 * cpu / max(requests, 1), 1)
    return row


@contextmanager
def _origin(tree: Tree, env: dict[str, str], logs: Path) -> Iterator[tuple[str, int]]:
    """The tree's origin serving until the block ends: (its URL, its pid)."""
    port = free_port()
    process = ChildProcess(
        f"the {tree.name} origin", tree.serve_command(port), logs / f"{tree.name}.log", env,
        cwd=tree.root,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_http(url + "/healthz", timeout=120)
        yield url, process.pid
    finally:
        process.stop(timeout=30)


def _median(rows: list[dict[str, Any]], target: str, field: str) -> float | None:
    values = [row[target][field] for row in rows if row[target].get(field) is not None]
    return round(statistics.median(values), 3) if values else None


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    medians = {
        target: {field: _median(rows, target, field) for field in ("ttfb_p50_ms", "ttfb_p90_ms")}
        for target in TARGETS
    }
    for target in ("base", "current"):
        medians[target]["cpu_us_per_request"] = _median(rows, target, "cpu_us_per_request")

    def minus(a: str, b: str, field: str) -> dict[str, float | None]:
        x, y = medians[a][field], medians[b][field]
        pairs = [
            row[a][field] - row[b][field]
            for row in rows
            if row[a][field] is not None and row[b][field] is not None
        ]
        return {
            "of_medians": round(x - y, 3) if x is not None and y is not None else None,
            "paired_median": round(statistics.median(pairs), 3) if pairs else None,
        }

    deltas = {
        f"{a}_minus_{b}_{field[5:8]}_ms": minus(a, b, field)
        for a, b in (("current", "floor"), ("current", "base"), ("base", "floor"))
        for field in ("ttfb_p50_ms", "ttfb_p90_ms")
    }
    over_floor = deltas["current_minus_floor_p50_ms"]["of_medians"]
    over_base = deltas["current_minus_base_p50_ms"]["of_medians"]
    checks = {  # the two bounds, on the medians of the p50s
        "current_no_worse_than_base": over_base is not None and over_base <= 0,
        "current_within_0_5_ms_of_floor": over_floor is not None and over_floor <= 0.5,
    }
    return {"median": medians, "delta": deltas, "checks": checks}


def run(
    base: str = BASE_COMMIT,
    current: Path = _CHECKOUT,
    rounds: int = 10,
    requests: int = 600,
    warmup: int = 50,
    current_env: dict[str, str] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The whole A/B: every round's rows, the medians, the differences and the checks;
    ``current_env`` is added to the current origin's environment (e.g. to tell what a
    setting costs: ``PRISM_REQUEST_LOG=off``)."""
    nonce = uuid.uuid4().hex[:8]
    started = time.monotonic()
    load_before = load_average()
    with ExitStack() as stack:
        trees = {
            "base": Tree("base", stack.enter_context(base_worktree(base))),
            "current": Tree("current", current.resolve()),
        }
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ttfb-ab-logs-")))
        redis = stack.enter_context(RedisServer(workdir=folder))
        provider_url = stack.enter_context(provider_process(reply_words=0))
        targets, about = {}, {}
        for name, tree in trees.items():
            env = tree.env(redis.url, provider_url)
            if name == "current":
                env.update(current_env or {})
            about[name] = {"tree": str(tree.root), "commit": tree.commit(), **tree.loaded(env)}
            url, pid = stack.enter_context(_origin(tree, env, folder))
            targets[name] = Target(name, url, f"Bearer {tree.mint_key(env)}", "miss", pid)
        targets["floor"] = Target("floor", provider_url, "Bearer bench", None, None)
        for name in TARGETS:  # modules loaded, connections pooled, memos filled
            warm = _round(targets[name], warmup, f"{nonce}-{name}-warm")
            if warm["answered"] < warmup:  # a set-up fault (a key refused...), not noise
                raise RuntimeError(f"{name} failed in the warm-up: {targets[name].failure}")
        rows: list[dict[str, Any]] = []
        for number in range(rounds):
            row: dict[str, Any] = {"round": number}
            for name in TARGETS:
                row[name] = _round(targets[name], requests, f"{nonce}-{name}-{number}")
            rows.append(row)
            if on_row is not None:
                on_row(row)
    about["base"]["asked"] = base
    about["current"]["env"] = current_env or {}
    return {
        "targets": about,
        "config": {
            **{"rounds": rounds, "requests": requests, "warmup": warmup, "concurrency": 1},
            "provider": "deploy.local.provider, no delay, bare echo in 8 chunks",
        },
        "machine": {**machine_info(), "load_before": load_before, "load_after": load_average()},
        "seconds": round(time.monotonic() - started, 1),
        "rounds": rows,
        **_summary(rows),
    }


def _describe(row: dict[str, Any]) -> str:
    parts = [f"round {row['round']}:"]
    for name in TARGETS:
        figures = row[name]
        cpu = f", {figures['cpu_us_per_request']} us CPU" if "cpu_us_per_request" in figures else ""
        parts.append(
            f"{name} p50 {figures['ttfb_p50_ms']} p90 {figures['ttfb_p90_ms']} ms"
            f" ({figures['answered']}/{figures['requests']}{cpu})"
        )
    return "  ".join(parts)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.bench.ttfb_ab",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--base", default=BASE_COMMIT, help="the commit to compare against")
    parser.add_argument(
        "--current", type=Path, default=_CHECKOUT, help="the checkout whose origin is today's"
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=600, help="per target and round")
    parser.add_argument("--warmup", type=int, default=50, help="per target, before round 0")
    parser.add_argument(
        "--current-env", action="append", default=[], metavar="NAME=VALUE",
        help="a variable for the current origin only (repeatable)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="the whole report as JSON")
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.current_env):
        parser.error("--current-env takes NAME=VALUE")
    current_env = dict(item.split("=", 1) for item in args.current_env)
    try:
        report = run(
            args.base, args.current, args.rounds, args.requests, args.warmup, current_env,
            on_row=None if args.json else lambda row: print(_describe(row), flush=True),
        )  # fmt: skip
    except BaseTreeUnavailable as error:
        parser.exit(2, f"{parser.prog}: {error}\n")
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for name in ("base", "current"):
        about = report["targets"][name]
        compiled = f"{len(about['compiled'])} compiled modules" if about["compiled"] else "pure"
        print(f"{name}: {about['commit']} ({compiled}) from {about['origin']}")
        if about["stale"]:
            print(f"  stale build? .so older than their .py: {', '.join(about['stale'])}")
    for name in TARGETS:
        print(f"median {name}: {report['median'][name]}")
    for name, delta in report["delta"].items():
        print(f"{name}: {delta['of_medians']} (paired {delta['paired_median']})")
    print(f"checks: {report['checks']}  load {report['machine']['load_before']} -> "
          f"{report['machine']['load_after']}, {report['seconds']} s")  # fmt: skip


if __name__ == "__main__":
    main()
