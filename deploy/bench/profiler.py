"""Where the origin's time goes: py-spy attached to it during an extra, unmeasured run.

py-spy samples the process from outside (no code change, no restart) and writes
collapsed stacks; this module turns them into the top frames by own time (the
frame on top of the stack) and by total time (anywhere on the stack). Profiled
runs are never the measured ones: on two cores the sampler takes CPU from the
server it watches.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PySpy", "find_py_spy", "summarize_collapsed"]


def find_py_spy() -> str | None:
    """py-spy next to this interpreter (the bench extra installs it there), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _short(frame: str) -> str:
    """``function (package/module.py)``: no line number, so one function is one row."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/work/main/", "python3.11/", "python3.12/"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    return f"{name} ({where})" if where else name


def _area(frame: str) -> str:
    """The package a frame's code belongs to: ``origin``, ``httpcore``, ``json``…"""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    if name == "Runner.run" and where.startswith("asyncio/"):
        return "event loop (uvloop, C)"
    if "/" in where:
        return where.split("/", 1)[0]
    if where.startswith("<frozen"):
        return "stdlib"
    return where.removesuffix(".py") or "?"


_LOOP = "Runner.run (asyncio/runners.py)"


def summarize_collapsed(text: str, top: int = 15) -> dict[str, Any]:
    """Own time by package, and the top functions by own and by total share of the samples.

    Own time is the function on top of the stack; with uvloop, time spent in the
    C event loop (polling, socket writes, callbacks) lands on ``Runner.run``.
    Total time counts only what runs above the event loop: the CLI and uvicorn
    start-up frames under it are on every stack and say nothing.
    """
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    samples = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";") if f]
        if not frames:
            continue
        samples += count
        own[frames[-1]] += count
        areas[_area(frames[-1])] += count
        above = frames[frames.index(_LOOP) + 1 :] if _LOOP in frames else frames
        for frame in set(above):
            total[frame] += count

    def rows(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"frame": frame, "share": round(count / samples, 4), "samples": count}
            for frame, count in counter.most_common(top)
        ]

    return {
        "samples": samples,
        "by_area": rows(areas),
        "top_own": rows(own),
        "top_total": rows(total),
    }


@dataclass
class PySpy:
    """``with PySpy(path, pid, seconds, out) as spy: ...`` then ``spy.summary()``."""

    path: str
    pid: int
    seconds: int
    out: Path
    rate: int = 250
    _proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PySpy:
        self._proc = subprocess.Popen(
            [self.path, "record", "--pid", str(self.pid), "--duration", str(self.seconds),
             "--rate", str(self.rate), "--format", "raw", "--output", str(self.out),
             "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=self.seconds + 30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def summary(self, top: int = 15) -> dict[str, Any]:
        if not self.out.exists():
            error = b""
            if self._proc is not None and self._proc.stderr is not None:
                error = self._proc.stderr.read()
            return {"error": error.decode(errors="replace")[-300:] or "py-spy wrote nothing"}
        return summarize_collapsed(self.out.read_text(), top)
