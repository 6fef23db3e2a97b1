"""The local stack's origins watched while it serves: one that exits is restarted, one
that is stopped (SIGSTOP) or resumed is reported, and the rest of the stack keeps serving
(the edge fails over meanwhile). `prism dev` asks ``OriginWatch.check`` a few times a
second and prints what it says."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from deploy.local.processes import ChildProcess

__all__ = ["OriginState", "OriginWatch", "WatchedOrigin", "process_stopped"]

OriginState = Literal["up", "stopped", "restarting"]
# An origin that exits again this soon after a restart waits this long for the next one
# (a bad setting would otherwise restart it in a tight loop).
_RESTART_EVERY = 2.0


def process_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (by SIGSTOP or a tracer), from Linux's /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] in ("T", "t")


@dataclass
class WatchedOrigin:
    name: str
    region: str
    url: str  # its public listener; /healthz there says it is back
    args: list[str]
    log: Path
    env: Mapping[str, str]
    process: ChildProcess
    state: OriginState = "up"
    restarted_at: float = field(default=-_RESTART_EVERY)
    restarts: int = 0


class OriginWatch:
    def __init__(self) -> None:
        self.origins: list[WatchedOrigin] = []

    def add(
        self, name: str, region: str, url: str, args: list[str], log: Path, env: Mapping[str, str]
    ) -> ChildProcess:
        process = ChildProcess(name, args, log, env)
        self.origins.append(WatchedOrigin(name, region, url, args, log, env, process))
        return process

    def states(self) -> dict[str, OriginState]:
        """Each origin's state by region."""
        return {origin.region: origin.state for origin in self.origins}

    def check(self) -> list[str]:
        """What changed since the last check, one line each; an exited origin restarted."""
        said: list[str] = []
        now = time.monotonic()
        for origin in self.origins:
            process = origin.process
            if not process.alive():
                if now - origin.restarted_at < _RESTART_EVERY:
                    continue
                code = process.popen.returncode
                process.stop()
                origin.process = ChildProcess(origin.name, origin.args, origin.log, origin.env)
                origin.restarted_at, origin.state = now, "restarting"
                origin.restarts += 1
                said.append(
                    f"{origin.name} exited (status {code}); restarting it, the edge asks "
                    "the other region meanwhile"
                )
            elif origin.state == "restarting":
                if _answers(origin.url):
                    origin.state = "up"
                    said.append(f"{origin.name} is back at {origin.url}")
            elif process_stopped(process.pid):
                if origin.state == "up":
                    origin.state = "stopped"
                    said.append(
                        f"{origin.name} is stopped (SIGSTOP?); the edge asks the other "
                        "region until it resumes"
                    )
            elif origin.state == "stopped":
                origin.state = "up"
                said.append(f"{origin.name} resumed")
        return said

    def stop(self) -> None:
        for origin in reversed(self.origins):
            origin.process.stop()
        self.origins.clear()


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url + "/healthz", timeout=0.5).status_code == 200
    return False
