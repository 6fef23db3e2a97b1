"""Shared fixtures live in tests/fixtures/*; registered here once."""

pytest_plugins = [
    "tests.fixtures.provider",
    "tests.fixtures.workers",
    "tests.fixtures.cli",
    "tests.fixtures.aws",
    "tests.fixtures.origin",
    "tests.fixtures.edge",
    "tests.fixtures.otlp",
]
