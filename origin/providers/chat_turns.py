"""OpenAI chat messages as the strictly alternating user/assistant turns that Anthropic's
Messages and Bedrock's Converse take, each kind giving its own content blocks.

One walk for both: system and developer messages are set apart; a user message is its
content's blocks; an assistant message its content's blocks then a block per tool call;
a tool message (a call's result) is a user turn of one result block; an empty turn is
left out (both APIs refuse one); consecutive turns of one role (parallel tool results,
then the user's next words) are merged, as both APIs want them alternating.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import orjson

from prism import InvalidRequestError

__all__ = ["ToolCall", "TurnBlocks", "alternating_turns", "tool_call"]

S = TypeVar("S")  # what a system message becomes (Anthropic: its text; Converse: blocks)
Block = dict[str, Any]


@dataclass(frozen=True, slots=True)
class TurnBlocks(Generic[S]):
    """A kind's blocks: each builder takes the value and its ``param`` path for errors."""

    system: Callable[[Any, str], list[S]]
    content: Callable[[Any, str], list[Block]]
    tool_use: Callable[[Any, str], Block]
    tool_result: Callable[[dict[str, Any], str], Block]


def _invalid(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


class ToolCall(NamedTuple):
    id: str
    name: str
    arguments: dict[str, Any]  # parsed: every kind sends them as an object


def tool_call(call: Any, param: str) -> ToolCall:
    """An assistant message's OpenAI tool call, checked: a named function whose arguments
    are a JSON object, with a non-empty id (400s naming ``param`` otherwise)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _invalid(f"'{param}.function.name' must be a string.", param)
    assert isinstance(call, dict)
    arguments = function.get("arguments") or "{}"
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) else None
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise _invalid(f"'{param}.function.arguments' must be a JSON object.", param)
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"'{param}.id' must be a non-empty string.", param)
    return ToolCall(call_id, function["name"], parsed)


def alternating_turns(messages: Any, blocks: TurnBlocks[S]) -> tuple[list[S], list[Block]]:
    """The system parts, and the conversation as alternating user/assistant turns."""
    if not isinstance(messages, list):
        raise _invalid("'messages' must be an array of message objects.", "messages")
    system: list[S] = []
    turns: list[Block] = []
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _invalid(f"'{param}' must be an object.", param)
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            system += blocks.system(content, f"{param}.content")
            continue
        if role == "user":
            made = blocks.content(content, f"{param}.content")
        elif role == "assistant":
            made = blocks.content(content, f"{param}.content")
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise _invalid(f"'{param}.tool_calls' must be an array.", f"{param}.tool_calls")
            made += [
                blocks.tool_use(call, f"{param}.tool_calls[{i}]") for i, call in enumerate(calls)
            ]
        elif role == "tool":
            role, made = "user", [blocks.tool_result(message, param)]
        else:
            raise _invalid(
                f"Role {role!r} is not supported for this model; use 'tool' messages.",
                f"{param}.role",
            )
        if not made:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(made)
        else:
            turns.append({"role": role, "content": made})
    return system, turns
