"""The edge's route table, as a pure function (the runtime tests are in test_adversarial)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.routes import (
    ROUTES,
    STORED_RESPONSES,
    canonical_path,
    normal_path,
    stored_response_methods,
)
from prism.routes import CHAT_PATH, EMBEDDINGS_PATH, MESSAGES_PATH, MODELS_PATH, RESPONSES_PATH


@pytest.mark.parametrize(
    ("path", "route"),
    [
        (CHAT_PATH, CHAT_PATH),
        (MODELS_PATH, MODELS_PATH),
        ("/v1//models", MODELS_PATH),
        ("/v1/./models", MODELS_PATH),
        ("/v1/x/../models", MODELS_PATH),
        ("/v1/chat%2Fcompletions", CHAT_PATH),
        ("/v1/%2e%2e/healthz", None),
        ("/v1/%2E%2E/metrics", None),
        ("/v1/../metrics", None),
        ("/../../v1/%2e%2e/metrics", None),
        ("/v1/%252e%252e/metrics", None),  # decoded once only
        ("/healthz", None),
        ("/metrics", None),
        ("/", None),
        ("", None),
        ("/v1/embeddings", EMBEDDINGS_PATH),
        ("/v1//messages", MESSAGES_PATH),
        ("/v1/completions", None),
        ("/V1/models", None),
        ("/v1/models%00", None),
        (RESPONSES_PATH, RESPONSES_PATH),
        ("/v1/responses/resp_abc-1", STORED_RESPONSES),
        ("/v1/responses//resp_abc/./input_items", STORED_RESPONSES),
        ("/v1/responses/resp_abc/cancel", STORED_RESPONSES),
        ("/v1/responses/", RESPONSES_PATH),  # a trailing slash: the route itself, not its subtree
        ("/v1/responses/resp_abc/other", None),
        ("/v1/responses/resp_abc/input_items/x", None),
        ("/v1/responses/resp%20abc", None),
        ("/v1/responses/" + "r" * 201, None),
        ("/v1/responses/resp_abc/../../models", MODELS_PATH),
    ],
)
def test_paths_name_a_route_or_nothing(path: str, route: str | None) -> None:
    assert canonical_path(path) == route


@given(st.text(max_size=80) | st.text(st.sampled_from("/.%2eEv1modelsFhz"), max_size=40))
def test_any_path_is_a_known_route_or_none(path: str) -> None:
    assert canonical_path(path) in (None, *ROUTES)


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/v1/responses/resp_1", {"GET", "DELETE"}),
        ("/v1/responses/resp_1/input_items", {"GET"}),
        ("/v1/responses/resp_1/cancel", {"POST"}),
    ],
)
def test_a_stored_response_takes_its_parts_methods(path: str, methods: set[str]) -> None:
    assert stored_response_methods(normal_path(path)) == methods
