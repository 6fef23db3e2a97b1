"""Shared fixtures live in tests/fixtures/*; registered here once."""

import os

from hypothesis import settings

from deploy.local.ports import share_ports

pytest_plugins = [
    "tests.fixtures.provider",
    "tests.fixtures.workers",
    "tests.fixtures.cli",
    "tests.fixtures.aws",
    "tests.fixtures.origin",
    "tests.fixtures.origin_workers",
    "tests.fixtures.edge",
    "tests.fixtures.otlp",
]

# No per-example deadline (Hypothesis's default is 200 ms): the properties are about
# answers, not speed, and on a slow or busy machine one example can take that long.
settings.register_profile("prism", deadline=None)
settings.load_profile("prism")


def pytest_configure() -> None:
    # Each xdist worker its own part of the loopback ports (gw0, gw1, ...): two workers'
    # servers starting at once never pick the same port.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        share_ports(int(worker[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
