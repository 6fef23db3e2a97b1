"""Shared fixtures live in tests/fixtures/*; registered here once."""

from hypothesis import settings

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
