"""Load generation: wrk (a compiled, event-driven client) with a Lua script, or a fallback.

wrk is driven by a generated Lua script: POST bodies and headers, an optional
unique token per request (so every request of a "miss" run really misses), and
a ``done()`` hook that prints the latency distribution (wrk's own HdrHistogram,
microseconds) as one JSON line, rather than scraping its human-readable table.

When wrk is missing, a Python asyncio client does the same job. It is slower
than wrk and shares the interpreter with its own bookkeeping, so every result
says which tool produced it and how much CPU the tool used (a load generator
that is pegged is measuring itself, not the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .http1 import Connection, build_request, split_url

__all__ = [
    "FALLBACK_TOOL",
    "UNIQUE",
    "LoadResult",
    "LoadSpec",
    "lua_string",
    "percentile",
    "run_load",
    "wrk_path",
    "wrk_version",
]

#: Replaced by a token unique to each request (run nonce, thread, counter).
UNIQUE = "{{UNIQUE}}"
FALLBACK_TOOL = "python-asyncio (fallback: wrk not found)"
_MARK = "PRISM-BENCH-JSON "


@dataclass(frozen=True, slots=True)
class LoadSpec:
    url: str
    concurrency: int
    duration: float  # seconds (wrk rounds up to whole seconds)
    method: str = "POST"
    body: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    nonce: str = "x"  # part of every unique token, so two runs never share a body


@dataclass(frozen=True, slots=True)
class LoadResult:
    tool: str
    concurrency: int
    requests: int
    non_2xx: int  # answers with another status (expected for the bad-key row)
    errors: int  # socket errors and timeouts
    duration_s: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    loadgen_cpu_s: float  # CPU the load generator itself used (user + system)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def wrk_path() -> str | None:
    """wrk on PATH, unless ``PRISM_BENCH_LOADGEN=python`` asks for the fallback."""
    if os.environ.get("PRISM_BENCH_LOADGEN", "").lower() == "python":
        return None
    return shutil.which("wrk")


def wrk_version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    return (
        (out.stdout + out.stderr).splitlines()[0].split(" [")[0]
        if out.stdout + out.stderr
        else "wrk"
    )


def lua_string(text: str) -> str:
    """``text`` as a Lua string literal (bytes outside printable ASCII as ``\\ddd``)."""
    out = ['"']
    for byte in text.encode():
        if byte in (0x22, 0x5C) or byte < 0x20 or byte > 0x7E:
            out.append(f"\\{byte:03d}")
        else:
            out.append(chr(byte))
    out.append('"')
    return "".join(out)


def _lua_script(spec: LoadSpec) -> str:
    path = split_url(spec.url)[2]
    headers = ", ".join(f"[{lua_string(k)}] = {lua_string(v)}" for k, v in spec.headers.items())
    lines = [
        f"wrk.method = {lua_string(spec.method)}",
        f"wrk.path = {lua_string(path)}",
        f"wrk.headers = {{ {headers} }}",
    ]
    if UNIQUE in spec.body:
        prefix, suffix = spec.body.split(UNIQUE, 1)
        # A request() function makes wrk build every request in Lua; only runs that
        # need a new body each time pay for it.
        lines += [
            f"local prefix, suffix = {lua_string(prefix)}, {lua_string(suffix)}",
            f"local nonce = {lua_string(spec.nonce)}",
            "local count = 0",
            "local threads = 0",
            "function setup(thread) threads = threads + 1; thread:set('tid', threads) end",
            "function request()",
            "  count = count + 1",
            "  local body = prefix .. nonce .. '-' .. tostring(tid) .. '-' .. count .. suffix",
            "  return wrk.format(nil, nil, nil, body)",
            "end",
        ]
    else:
        lines.append(f"wrk.body = {lua_string(spec.body)}")
    lines += [
        "function done(summary, latency, requests)",
        "  local e = summary.errors",
        f"  io.write({lua_string(_MARK)})",
        '  io.write(string.format(\'{"requests":%d,"duration_us":%d,"connect":%d,'
        '\\"read\\":%d,\\"write\\":%d,\\"status\\":%d,\\"timeout\\":%d,'
        '\\"p50\\":%d,\\"p90\\":%d,\\"p99\\":%d,\\"max\\":%d,\\"mean\\":%.3f}\\n\','
        "    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,"
        "    latency:percentile(50), latency:percentile(90), latency:percentile(99),"
        "    latency.max, latency.mean))",
        "end",
    ]
    return "\n".join(lines) + "\n"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_wrk(wrk: str, spec: LoadSpec) -> LoadResult:
    threads = max(1, min(spec.concurrency, os.cpu_count() or 1))
    seconds = max(1, round(spec.duration))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_lua_script(spec))
    try:
        cpu_before = _children_cpu()
        out = subprocess.run(
            [wrk, "-t", str(threads), "-c", str(spec.concurrency), "-d", f"{seconds}s",
             "--timeout", "10s", "-s", script.name, spec.url],
            capture_output=True, text=True, timeout=seconds + 60,
        )  # fmt: skip
        cpu = _children_cpu() - cpu_before
    finally:
        os.unlink(script.name)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith(_MARK)), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {(out.stderr or out.stdout)[-400:]}")
    data = json.loads(line[len(_MARK) :])
    duration = data["duration_us"] / 1e6
    errors = sum(data[k] for k in ("connect", "read", "write", "timeout"))
    return LoadResult(
        tool="wrk",
        concurrency=spec.concurrency,
        requests=data["requests"],
        non_2xx=data["status"],
        errors=errors,
        duration_s=round(duration, 3),
        rps=round(data["requests"] / duration, 1) if duration else 0.0,
        p50_ms=data["p50"] / 1000,
        p90_ms=data["p90"] / 1000,
        p99_ms=data["p99"] / 1000,
        max_ms=data["max"] / 1000,
        mean_ms=round(data["mean"] / 1000, 3),
        loadgen_cpu_s=round(cpu, 3),
    )


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, round(pct / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


async def _fallback(spec: LoadSpec) -> tuple[list[float], int, int, float]:
    host, port, path = split_url(spec.url)
    latencies: list[float] = []
    errors = non_2xx = 0
    counter = 0
    deadline = time.perf_counter() + spec.duration

    async def worker(number: int) -> None:
        nonlocal errors, non_2xx, counter
        conn = await Connection.open(host, port)
        try:
            while time.perf_counter() < deadline:
                counter += 1
                body = spec.body.replace(UNIQUE, f"{spec.nonce}-{number}-{counter}")
                raw = build_request(
                    spec.method, host, port, path, dict(spec.headers), body.encode()
                )
                started = time.perf_counter()
                try:
                    reply = await conn.send(raw)
                except (OSError, asyncio.IncompleteReadError):
                    errors += 1
                    await conn.close()
                    conn = await Connection.open(host, port)
                    continue
                latencies.append(time.perf_counter() - started)
                if not 200 <= reply.status < 300:
                    non_2xx += 1
        finally:
            await conn.close()

    began = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(spec.concurrency)))
    return latencies, errors, non_2xx, time.perf_counter() - began


def _run_fallback(spec: LoadSpec) -> LoadResult:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = usage.ru_utime + usage.ru_stime
    runner: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    latencies, errors, non_2xx, elapsed = runner(_fallback(spec))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    values = sorted(x * 1000 for x in latencies)
    return LoadResult(
        tool=FALLBACK_TOOL,
        concurrency=spec.concurrency,
        requests=len(values),
        non_2xx=non_2xx,
        errors=errors,
        duration_s=round(elapsed, 3),
        rps=round(len(values) / elapsed, 1) if elapsed else 0.0,
        p50_ms=round(percentile(values, 50), 3),
        p90_ms=round(percentile(values, 90), 3),
        p99_ms=round(percentile(values, 99), 3),
        max_ms=round(values[-1], 3) if values else 0.0,
        mean_ms=round(sum(values) / len(values), 3) if values else 0.0,
        loadgen_cpu_s=round(usage.ru_utime + usage.ru_stime - cpu_before, 3),
    )


def run_load(spec: LoadSpec) -> LoadResult:
    """Drive ``spec`` with wrk when it is installed, else with the Python fallback."""
    wrk = wrk_path()
    return _run_wrk(wrk, spec) if wrk else _run_fallback(spec)
