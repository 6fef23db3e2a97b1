"""``read_body``: a request's body from the ASGI messages the server hands it, whole or
refused, however it arrives."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from origin.http.asgi import read_body
from prism import InvalidRequestError, RequestTooLargeError


def _messages(*messages: dict[str, Any]) -> Callable[[], Awaitable[dict[str, Any]]]:
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    return receive


def _part(body: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


async def test_a_body_in_one_message_is_returned_as_sent() -> None:
    assert await read_body(_messages(_part(b'{"a":1}', False)), 100, "7") == b'{"a":1}'


async def test_a_body_in_parts_is_joined_in_order() -> None:
    receive = _messages(_part(b"ab", True), _part(b"", True), _part(b"cd", False))
    assert await read_body(receive, 100, None) == b"abcd"


async def test_a_message_without_a_body_is_an_empty_body() -> None:
    assert await read_body(_messages({"type": "http.request"}), 100, None) == b""


@pytest.mark.parametrize(
    "messages",
    [
        [_part(b"x" * 101, False)],
        [_part(b"x" * 60, True), _part(b"x" * 41, False)],
    ],
    ids=["one message", "in parts"],
)
async def test_a_body_over_the_limit_is_refused(messages: list[dict[str, Any]]) -> None:
    with pytest.raises(RequestTooLargeError):
        await read_body(_messages(*messages), 100, None)


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    with pytest.raises(RequestTooLargeError, match="101 bytes"):
        await read_body(_messages(), 100, "101")  # no message is read: none is there


@pytest.mark.parametrize(
    "messages",
    [[{"type": "http.disconnect"}], [_part(b"ab", True), {"type": "http.disconnect"}]],
    ids=["before the body", "mid-body"],
)
async def test_a_client_that_leaves_before_the_whole_body_is_an_incomplete_body(
    messages: list[dict[str, Any]],
) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        await read_body(_messages(*messages), 100, None)
    assert refused.value.code == "incomplete_body"
