"""The supervisor's own decisions that need no running worker (the rest, with real
workers: tests/deploy/test_origin_workers.py)."""

from __future__ import annotations

import socket

import uvicorn

from origin.instance import WorkerOptions, WorkerProcess


def test_a_worker_is_stalled_once_its_loop_has_not_ticked_for_the_limit() -> None:
    """The beat is the time of the worker loop's last tick: none yet is not a stall (it is
    starting); older than the limit is, by how long."""
    with socket.socket() as sock:
        worker = WorkerProcess(uvicorn.Config("x:y"), [sock], WorkerOptions())
        try:
            assert worker.stalled(now=1000.0, limit=30) is None  # not started
            worker.beat.value = 990.0
            assert worker.stalled(now=1000.0, limit=30) is None
            assert worker.stalled(now=1031.0, limit=30) == 41.0
        finally:
            worker.close_pipes()
