"""An origin instance of several worker processes (``prism origin serve --workers N``):
the supervisor, each worker's start, and the one admin view of them all."""

from .admin import WorkerView, instance_admin
from .merge import MAX_GAUGES, merge_health, merge_metrics
from .supervisor import Supervisor, WorkerProcess, serve_workers
from .worker import WorkerOptions

__all__ = [
    "MAX_GAUGES",
    "Supervisor",
    "WorkerOptions",
    "WorkerProcess",
    "WorkerView",
    "instance_admin",
    "merge_health",
    "merge_metrics",
    "serve_workers",
]
