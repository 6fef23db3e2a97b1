"""What the local provider answers, before it is put in any API's format.

A chat request of any API (``openai_reply``, ``anthropic_reply``, ``responses_reply``) is
checked and read into a ``ScriptedReply``: the echo of the last user text, the tag that
makes it depend on the whole body, a tool call when the request asks for one (an object
fitting the schema when an OpenAI request asks for JSON-schema output), and the token
counts. Apart from the wire formats (``provider_openai``, ``provider_anthropic``,
``provider_responses``, ``provider_sse``) because the one reply is put in each of them:
the same body always gets the same content, streamed or not. A request that asks to continue
a partial answer (``continued_reply``: Anthropic's prefill, an OpenAI request's
``continue_final_message`` or ``prefix``) whose text begins the answer the messages before it
would get is answered with the rest of that answer alone, as a real provider continues.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from deploy.local.provider_settings import ProviderSettings

__all__ = [
    "ScriptedReply",
    "anthropic_reply",
    "continued_reply",
    "openai_reply",
    "require",
    "responses_reply",
]

_TRANSPORT_KEYS = frozenset({"stream", "stream_options", "user", "metadata"})
_FILLER = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
_WORDS = re.compile(r"\s*\S+\s*")
_MAX_N = 16


@dataclass(frozen=True, slots=True)
class _ToolCall:
    name: str
    input: dict[str, Any]
    arguments: str  # the same input as JSON text


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    """One answer to a chat request, before it is put in either API's format."""

    tag: str
    model: str
    texts: tuple[str, ...]  # one per choice; unused when the choices are tool calls
    tool_call: _ToolCall | None
    prompt_tokens: int
    completion_tokens: int


def _digest(body: dict[str, Any]) -> str:
    kept = {k: v for k, v in body.items() if k not in _TRANSPORT_KEYS}
    return hashlib.sha256(orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)).hexdigest()[:10]


def _text_of(content: Any) -> str:
    """Text of a message content: a string, or OpenAI parts / Anthropic blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _sample_input(schema: Any, text: str, tag: str) -> dict[str, Any]:
    """Deterministic arguments that fit a JSON schema's top-level properties."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return {}
    snippet = text[:40] or tag
    out: dict[str, Any] = {}
    for key, spec in props.items():
        spec = spec if isinstance(spec, dict) else {}
        enum = spec.get("enum")
        kind = spec.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if isinstance(enum, list) and enum:
            out[key] = enum[0]
        else:
            samples = {"integer": len(text), "number": len(text) / 2, "boolean": True}
            out[key] = {"array": [], "object": {}, **samples}.get(str(kind), snippet)
    return out


def _build_reply(
    settings: ProviderSettings,
    body: dict[str, Any],
    texts_in: list[str],
    last_user: str,
    tool: tuple[str, Any] | None,
    n: int,
    schema: Any = None,
) -> ScriptedReply:
    tag = _digest(body)
    prompt_tokens = max(1, sum(len(t.split()) for t in texts_in))
    snippet = " ".join(last_user.split())[: settings.echo_chars]
    if tool is not None:
        tool_input = _sample_input(tool[1], snippet, tag)
        arguments = orjson.dumps(tool_input).decode()
        call = _ToolCall(tool[0], tool_input, arguments)
        completion = n * max(1, len(arguments) // 4)
        return ScriptedReply(tag, str(body["model"]), ("",) * n, call, prompt_tokens, completion)
    if schema is not None:  # structured output: an object that fits the schema asked for
        text = orjson.dumps(_sample_input(schema, snippet, tag)).decode()
        completion = n * max(1, len(text) // 4)
        return ScriptedReply(tag, str(body["model"]), (text,) * n, None, prompt_tokens, completion)
    words = ["Echo:", *snippet.split()]
    filler = max(0, settings.reply_words - len(words) - 1)
    words += [_FILLER[i % len(_FILLER)] for i in range(filler)]
    base = " ".join(words)
    # Each choice gets its own tag so n > 1 yields distinct, still deterministic, choices.
    texts = tuple(f"{base} [{tag if i == 0 else f'{tag}.{i}'}]" for i in range(n))
    completion = sum(len(t.split()) for t in texts)
    return ScriptedReply(tag, str(body["model"]), texts, None, prompt_tokens, completion)


def _mentioned(tools: list[tuple[str, Any]], text: str) -> tuple[str, Any] | None:
    return next((t for t in tools if t[0] and t[0] in text), None)


def _named(tools: list[tuple[str, Any]], name: Any) -> tuple[str, Any]:
    return next((t for t in tools if t[0] == name), (str(name), {}))


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def openai_reply(settings: ProviderSettings, body: dict[str, Any]) -> ScriptedReply:
    messages = body.get("messages")
    require(isinstance(body.get("model"), str) and bool(body["model"]), "'model' is required")
    require(isinstance(messages, list) and bool(messages), "'messages' must be a non-empty list")
    assert isinstance(messages, list)
    require(all(isinstance(m, dict) for m in messages), "each message must be an object")
    n = 1 if body.get("n") is None else body["n"]
    require(isinstance(n, int) and 1 <= n <= _MAX_N, f"'n' must be an integer in 1..{_MAX_N}")
    texts = [_text_of(m.get("content")) for m in messages]
    users = [t for m, t in zip(messages, texts, strict=True) if m.get("role") == "user"]
    last_user = users[-1] if users else ""
    tools = [
        (str(t["function"].get("name", "")), t["function"].get("parameters"))
        for t in body.get("tools") or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]
    choice = body.get("tool_choice")
    tool: tuple[str, Any] | None = None
    if tools and choice == "required":
        tool = tools[0]
    elif tools and isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        tool = _named(tools, choice["function"].get("name"))
    elif tools and choice in (None, "auto") and messages[-1].get("role") == "user":
        tool = _mentioned(tools, last_user)
    form = body.get("response_format")
    schema = form.get("json_schema") if isinstance(form, dict) else None
    schema = schema.get("schema") if isinstance(schema, dict) else None
    return _build_reply(settings, body, texts, last_user, tool, n, schema)


def _item_text(item: Any) -> str:
    """The text of a Responses input item: a message's content, a call's output."""
    if not isinstance(item, dict):
        return ""
    content = item.get("content", item.get("output"))
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") in ("input_text", "output_text")
        )
    return content if isinstance(content, str) else ""


def responses_reply(settings: ProviderSettings, body: dict[str, Any]) -> ScriptedReply:
    """A Responses API request (OpenAI's own ``POST /v1/responses``), read as the others."""
    value = body.get("input")
    require(isinstance(body.get("model"), str) and bool(body["model"]), "'model' is required")
    require(isinstance(value, (str, list)) and bool(value), "'input' must be a string or list")
    items = [{"role": "user", "content": value}] if isinstance(value, str) else value
    assert isinstance(items, list)
    instructions = body.get("instructions")
    texts = [instructions if isinstance(instructions, str) else ""]
    texts += [_item_text(item) for item in items]
    users = [
        _item_text(i) for i in items if isinstance(i, dict) and i.get("role", "user") == "user"
    ]
    last_user = users[-1] if users else ""
    tools = [
        (str(t.get("name", "")), t.get("parameters"))
        for t in body.get("tools") or []
        if isinstance(t, dict) and t.get("type") == "function"
    ]
    choice = body.get("tool_choice")
    last = items[-1] if isinstance(items[-1], dict) else {}
    tool: tuple[str, Any] | None = None
    if tools and choice == "required":
        tool = tools[0]
    elif tools and isinstance(choice, dict) and choice.get("type") == "function":
        tool = _named(tools, choice.get("name"))
    elif tools and choice in (None, "auto") and last.get("type", "message") == "message":
        tool = _mentioned(tools, last_user)
    form = body.get("text", {}).get("format") if isinstance(body.get("text"), dict) else None
    schema = form.get("schema") if isinstance(form, dict) else None
    return _build_reply(settings, body, texts, last_user, tool, 1, schema)


def anthropic_reply(settings: ProviderSettings, body: dict[str, Any]) -> ScriptedReply:
    messages = body.get("messages")
    require(isinstance(body.get("model"), str) and bool(body["model"]), "model: Field required")
    require(isinstance(body.get("max_tokens"), int), "max_tokens: Field required")
    require(isinstance(messages, list) and bool(messages), "messages: must be a non-empty list")
    assert isinstance(messages, list)
    require(all(isinstance(m, dict) for m in messages), "messages: each must be an object")
    texts = [_text_of(body.get("system")), *(_text_of(m.get("content")) for m in messages)]
    users = [t for m, t in zip(messages, texts[1:], strict=True) if m.get("role") == "user"]
    last_user = users[-1] if users else ""
    tools = [
        (str(t.get("name", "")), t.get("input_schema"))
        for t in body.get("tools") or []
        if isinstance(t, dict)
    ]
    choice = body.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, dict) else None
    tool: tuple[str, Any] | None = None
    if tools and kind == "any":
        tool = tools[0]
    elif tools and kind == "tool":
        tool = _named(tools, choice.get("name"))
    elif tools and kind == "auto" and messages[-1].get("role") == "user":
        # A tool_result turn has no text blocks, so the conversation can end with text.
        tool = _mentioned(tools, last_user)
    return _build_reply(settings, body, texts, last_user, tool, 1)


# The keys an OpenAI-compatible request continues its last message with (vLLM's).
_CONTINUE_KEYS = frozenset({"continue_final_message", "add_generation_prompt"})


def _to_continue(
    api: Literal["openai", "anthropic"], body: dict[str, Any]
) -> tuple[dict[str, Any], str] | None:
    """The request before its partial answer, and that answer, when ``body`` asks to
    continue one: a last assistant message that is Anthropic's prefill, or that an OpenAI
    request marks (``continue_final_message``, or the message's own ``prefix: true``)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) < 2 or not isinstance(messages[-1], dict):
        return None
    last = messages[-1]
    if last.get("role") != "assistant":
        return None
    if (
        api == "openai"
        and body.get("continue_final_message") is not True
        and not last.get("prefix")
    ):
        return None
    text = _text_of(last.get("content"))
    if api == "anthropic":
        # As Anthropic's API does: the prefill must not end in white space.
        require(
            text == text.rstrip(),
            "messages: final assistant content cannot end with trailing whitespace",
        )
    before = {k: v for k, v in body.items() if k not in _CONTINUE_KEYS}
    return {**before, "messages": messages[:-1]}, text


def continued_reply(
    settings: ProviderSettings,
    api: Literal["openai", "anthropic"],
    body: dict[str, Any],
    reply: Callable[[ProviderSettings, dict[str, Any]], ScriptedReply],
) -> ScriptedReply:
    """``reply`` to ``body``; when it asks to continue a partial answer that begins the
    answer the messages before it would get, only the rest of that answer (so a gateway's
    spliced answer is exactly the whole one)."""
    asked = _to_continue(api, body)
    if asked is None:
        return reply(settings, body)
    before, partial = asked
    whole = reply(settings, before)
    text = whole.texts[0]
    if whole.tool_call is not None or len(whole.texts) != 1 or not text.startswith(partial):
        return reply(settings, body)
    rest = text[len(partial) :]
    return dataclasses.replace(
        whole,
        texts=(rest,),
        prompt_tokens=whole.prompt_tokens + len(partial.split()),
        completion_tokens=max(1, len(rest.split())),
    )
