"""What the numbers were measured on: the machine, its load, the versions, and /proc readers.

A benchmark on a shared 2-core machine is only honest if it says so: the load
average before and after, the CPU each process used, and which versions of
every part were in play.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["CpuClock", "cpu_seconds", "load_average", "machine_info", "rss_mb", "versions"]

_TICKS = os.sysconf("SC_CLK_TCK")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gb() -> float:
    try:
        first = Path("/proc/meminfo").read_text().splitlines()[0]
        return round(int(first.split()[1]) / 1024 / 1024, 1)
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_info() -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gb": _mem_total_gb(),
        "kernel": platform.release(),
        "os": _os_name(),
        "python": platform.python_version(),
    }


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()


def _command_version(args: list[str], pattern: str) -> str | None:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(pattern, out.stdout + out.stderr)
    return found.group(1) if found else None


def versions(redis_server: str | None, node: str | None, miniflare: str | None) -> dict[str, Any]:
    """Versions of every part a number depends on (None: not found)."""
    packages = ("uvicorn", "uvloop", "httptools", "starlette", "redis", "httpx", "orjson")
    found: dict[str, Any] = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["python"] = sys.version.split()[0]
    if redis_server:
        found["redis-server"] = _command_version([redis_server, "--version"], r"v=(\S+)")
    if node:
        found["node"] = _command_version([node, "--version"], r"v(\S+)")
    found["miniflare"] = miniflare
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime are fields 14 and 15 of stat; index 11 and 12 after the name.
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_mb(pid: int) -> float:
    """Resident set size of one process, in MB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


@dataclass
class CpuClock:
    """CPU seconds a set of processes used between ``start()`` and ``stop()``."""

    pids: list[int]
    _began: float = 0.0

    def start(self) -> CpuClock:
        self._began = sum(cpu_seconds(pid) for pid in self.pids)
        return self

    def stop(self) -> float:
        return max(0.0, sum(cpu_seconds(pid) for pid in self.pids) - self._began)
