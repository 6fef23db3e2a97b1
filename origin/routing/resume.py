"""A stream that broke after the client had part of its answer, continued by another
target of its route, so the client still gets one whole answer.

What the client has (the operation's ``Continuation.partial``, read from the relayed
frames) is put last in the request as an assistant turn the continuing target carries on
from: Anthropic's kind as its native prefill, an OpenAI-compatible provider as its table's
``continuation`` says (``"continue_final_message"``: vLLM's flags; ``"prefix"``: DeepSeek's
and Mistral's ``prefix: true`` on that message). The continuation is asked for through the
router's own attempt path (``Router.resume``); only its rest is relayed, through the API's
splice. Chat's (``ChatContinuation``, ``Splice``): its chunks take the first part's ``id``,
``created`` and ``model``, its role chunk is dropped, and the final chunk says which
providers answered (``"prism": {"providers": [...], "resumed": true}``). Anthropic
Messages' is ``origin.apis.messages_resume``. Each provider is billed for its part: the
``Resumed`` answer carries what the broken part used (``origin.governance.resumed_bill``).

Only on the path of a broken stream: a healthy stream does no work of this module's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import orjson

from prism import PrismError, SSEDecoder, UpstreamError

from ..governance.resumed_bill import Resumption
from ..providers.base import ChatProvider, ProviderSpec, UpstreamCompletion, UpstreamStream
from ..providers.token_counts import Tokens, estimated_tokens, tokens_of
from .continuation import Continuation, Partial, Splicer, asks_afresh
from .operation import Operation, StreamBuilder
from .targets import Plan, Routed

__all__ = [
    "Asked",
    "ChatContinuation",
    "ContinuationOp",
    "Partial",
    "Relay",
    "Resumed",
    "Resumer",
    "Splice",
    "can_continue",
    "continuation_body",
    "partial_answer",
    "prefill",
    "resume",
    "trim_overlap",
]

log = logging.getLogger("prism.origin")

RESUMED, FAILED, UNAVAILABLE = "resumed", "failed", "unavailable"


def can_continue(spec: ProviderSpec) -> bool:
    """The provider can be asked to carry on from a partial answer."""
    return spec.kind == "anthropic" or spec.continuation is not None


def partial_answer(frames: list[bytes], usage: set[int]) -> Partial | None:
    """The one choice's text so far; None when it cannot be continued as text (a tool call,
    a refusal, a second choice, a finish already given, a frame that is not a chunk)."""
    text: list[str] = []
    meta: dict[str, Any] | None = None
    reported = None
    for index, frame in enumerate(frames):
        if index in usage:  # a usage chunk (some providers send one with every chunk)
            reported = _reported(frame) or reported
            continue
        try:
            chunk = orjson.loads(frame.removeprefix(b"data: "))
        except orjson.JSONDecodeError:
            return None
        if not isinstance(chunk, dict):
            return None
        if meta is None:
            meta = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                return None
            if choice.get("finish_reason"):
                return None
            delta = choice.get("delta") or {}
            if delta.get("tool_calls") or delta.get("function_call") or delta.get("refusal"):
                return None
            content = delta.get("content")
            if isinstance(content, str):
                text.append(content)
    return None if meta is None else Partial("".join(text), meta, reported)


def _reported(frame: bytes) -> Tokens | None:
    """The usage a relayed usage chunk reported."""
    try:
        chunk = orjson.loads(frame.removeprefix(b"data: "))
    except orjson.JSONDecodeError:
        return None
    return tokens_of(chunk.get("usage")) if isinstance(chunk, dict) else None


def prefill(spec: ProviderSpec, text: str) -> str:
    """The partial text as the provider is given it: Anthropic refuses a prefill that ends
    in white space, so that is left off (and dropped again from the continuation's start)."""
    return text.rstrip() if spec.kind == "anthropic" else text


def continuation_body(spec: ProviderSpec, body: dict[str, Any], text: str) -> dict[str, Any]:
    """``body`` asking ``spec``'s provider to carry on from ``text`` (unchanged when there
    is no text yet: the answer is asked for afresh)."""
    given = prefill(spec, text)
    if not given:
        return body
    message: dict[str, Any] = {"role": "assistant", "content": given}
    extra: dict[str, Any] = {}
    if spec.continuation == "prefix":
        message["prefix"] = True
    elif spec.continuation == "continue_final_message":
        extra = {"continue_final_message": True, "add_generation_prompt": False}
    return {**body, **extra, "messages": [*body["messages"], message]}


def trim_overlap(overlap: str, text: str) -> tuple[str, str]:
    """What is left of ``overlap`` and of ``text`` once the start they share is dropped:
    past the first text the overlap is settled, whether it matched or not."""
    same = 0
    while same < min(len(text), len(overlap)) and text[same] == overlap[same]:
        same += 1
    return (overlap[same:] if same == len(text) else ""), text[same:]


class ChatContinuation:
    """Chat's: the text of the one choice, carried on as ``continuation_body`` asks."""

    __slots__ = ("_stream",)

    def __init__(
        self, stream: Callable[[ChatProvider, dict[str, Any], str], Awaitable[UpstreamStream]]
    ) -> None:
        self._stream = stream  # the chat operation's own (it always asks for usage)

    def partial(self, body: dict[str, Any], frames: list[bytes], usage: set[int]) -> Partial | None:
        if body.get("n") not in (None, 1) or not asks_afresh(body):
            return None
        return partial_answer(frames, usage)

    def stream(
        self, provider: ChatProvider, body: dict[str, Any], model: str, text: str
    ) -> Awaitable[UpstreamStream]:
        return self._stream(provider, continuation_body(provider.spec, body, text), model)

    def splice(self, partial: Partial, overlap: str, providers: list[str]) -> Splice:
        return Splice(partial.meta, overlap, providers)


class ContinuationOp:
    """The operation, each target asked to carry on from the text so far its own way."""

    __slots__ = ("_continuation", "_op", "_text", "done_frame", "name")

    continuation = None  # a continuation that breaks too ends in its own error

    def __init__(self, op: Operation, continuation: Continuation, text: str) -> None:
        self._op = op
        self._continuation = continuation
        self._text = text
        self.name = op.name
        self.done_frame = op.done_frame

    def complete(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> Awaitable[UpstreamCompletion]:
        raise AssertionError("a continuation is always streamed")

    def stream(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> Awaitable[UpstreamStream]:
        return self._continuation.stream(provider, body, model, self._text)

    def builder(
        self, provider: str, body: dict[str, Any], redact: Callable[[str], str]
    ) -> StreamBuilder:
        return self._op.builder(provider, body, redact)

    def replay(self, result: UpstreamCompletion, include_usage: bool) -> bytes:
        return self._op.replay(result, include_usage)

    def error_frame(self, error: PrismError) -> bytes:
        return self._op.error_frame(error)


class Splice:
    """The continuation's events as the rest of the first part's answer: its chunks carry
    the first part's id, created and model; its role chunk goes, and any white space left
    off the prefill is dropped from its start; the last choice chunk and the usage chunk
    carry the ``prism`` extension. The last choice chunk is held until the next event says
    it was the last."""

    __slots__ = ("_extension", "_held", "_meta", "_overlap", "_started", "usage")

    def __init__(self, meta: dict[str, Any], overlap: str, providers: list[str]) -> None:
        self._meta = meta
        self._overlap = overlap
        self._extension = {"providers": providers, "resumed": True}
        self._held: dict[str, Any] | None = None
        self._started = False  # the first choice chunk has come
        self.usage: Tokens | None = None

    def feed(self, data: bytes) -> list[bytes]:
        """The events to relay for one of the continuation's (the data of each)."""
        if data == b"[DONE]":
            return [*self.end(), data]
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return [*self.end(), data]  # the builder says what is wrong with it
        if not isinstance(chunk, dict) or chunk.get("error"):
            return [*self.end(), data]
        chunk.update(self._meta)
        usage = chunk.get("usage")
        if usage:
            self.usage = tokens_of(usage)
        choices = chunk.get("choices")
        if not choices:
            if usage:
                return [*self.end(), orjson.dumps({**chunk, "prism": self._extension})]
            return [orjson.dumps(chunk)]
        if not self._kept(choices):
            return []
        out = self._flush(last=False)
        self._held = chunk
        return out

    def end(self) -> list[bytes]:
        """The held chunk, as the last one (the stream ended, or its usage came)."""
        return self._flush(last=True)

    def _flush(self, last: bool) -> list[bytes]:
        held, self._held = self._held, None
        if held is None:
            return []
        return [orjson.dumps({**held, "prism": self._extension} if last else held)]

    def _kept(self, choices: list[Any]) -> bool:
        """Trim the chunk's delta in place; False when nothing of it is left to relay."""
        kept = False
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                kept = True
                continue
            if not self._started:
                delta.pop("role", None)  # the client had the first part's
            content = delta.get("content")
            if self._overlap and isinstance(content, str) and content:
                self._overlap, content = trim_overlap(self._overlap, content)
                delta["content"] = content
            if (
                content
                or choice.get("finish_reason")
                or any(value for key, value in delta.items() if key != "content")
            ):
                kept = True
        if kept:
            self._started = True
        return kept


@runtime_checkable
class Resumer(Protocol):
    """What resuming asks of the router (``origin.routing.router.Router``; optional, so a
    router without it never resumes)."""

    def resume_plan(self, model: str, broken: Routed[UpstreamStream], text: str) -> Plan | None:
        """The targets that may continue ``broken``'s answer (none: ``targets`` empty);
        None when the route does not resume its streams."""
        ...

    async def resume(
        self, plan: Plan, body: dict[str, Any], op: Operation
    ) -> Routed[UpstreamStream]: ...

    def count_resumption(self, provider: str, outcome: str) -> None: ...

    def stream_failed(self, routed: Routed[UpstreamStream], error: PrismError) -> None: ...

    def stream_finished(self, routed: Routed[UpstreamStream]) -> None: ...


class Resumed(NamedTuple):
    result: UpstreamCompletion  # the whole answer, both parts
    routed: Routed[UpstreamStream]  # the continuation's: it answered last
    store: bool  # the route lets a spliced answer be cached
    resumption: Resumption  # each part billed to its own provider


class Relay(NamedTuple):
    """Where the continuation's frames go: the flight's own, as its first part's did."""

    frames: list[bytes]
    usage_frames: set[int]
    notify: Callable[[], None]


class Asked(NamedTuple):
    """The call whose stream broke."""

    body: dict[str, Any]
    model: str
    op: Operation
    request_id: str


async def resume(
    router: Resumer,
    relay: Relay,
    asked: Asked,
    broken: Routed[UpstreamStream],
    failure: PrismError,
    builder: StreamBuilder,
) -> Resumed | None:
    """Continue ``broken``'s answer on another target, relaying the rest to ``relay``;
    None when the route does not resume or no target can continue (``failure`` stands);
    raises the continuation's own failure when it broke after it relayed part."""
    body, model, op, request_id = asked
    continuation = op.continuation
    if continuation is None:
        return None
    partial = continuation.partial(body, relay.frames, relay.usage_frames)
    if partial is None:
        return None
    plan = router.resume_plan(model, broken, partial.text)
    if plan is None:
        return None
    if not plan.targets:
        router.count_resumption(broken.provider, UNAVAILABLE)
        log.info(
            "stream for request %s from %s broke (%s %s); no other target can continue it",
            request_id,
            broken.provider,
            failure.status,
            failure.code,
        )
        return None
    try:
        routed = await router.resume(plan, body, ContinuationOp(op, continuation, partial.text))
    except PrismError as refused:
        router.count_resumption(broken.provider, FAILED)
        log.info(
            "stream for request %s from %s broke (%s); its continuation failed: %s %s",
            request_id,
            broken.provider,
            failure.code,
            refused.status,
            refused.code,
        )
        return None
    spec = next(t.spec for t in plan.targets if t.name == routed.provider)
    overlap = partial.text[len(prefill(spec, partial.text)) :]
    splice = continuation.splice(partial, overlap, [broken.label, routed.label])
    upstream = routed.value
    try:
        try:
            error = await _relay(upstream, builder, splice, relay)
        except PrismError as raised:  # reported to the router by the events iterator
            error = raised
        result = builder.result() if error is None else None
        if result is None:
            error = error or UpstreamError(
                f"Provider '{routed.provider}' ended the continued stream before the answer"
                " was complete.",
                code="upstream_truncated",
            )
            router.stream_failed(routed, error)  # once only, whoever reported it first
            router.count_resumption(broken.provider, FAILED)
            log.info(
                "stream for request %s: the continuation from %s broke too: %s",
                request_id,
                routed.provider,
                error.code,
            )
            raise error
        router.stream_finished(routed)
    finally:
        with contextlib.suppress(Exception):
            await upstream.aclose()
    router.count_resumption(broken.provider, RESUMED)
    log.info(
        "stream for request %s from %s broke (%s) after %d characters; %s continued it",
        request_id,
        broken.provider,
        failure.code,
        len(partial.text),
        routed.provider,
    )
    # Each part billed to its own provider: the first's tokens as it reported them, else
    # estimated from the text the client had (``origin.governance.resumed_bill``).
    parts = Resumption(
        broken.provider, broken.model, partial.usage, estimated_tokens(partial.text), splice.usage
    )
    return Resumed(result, routed, plan.resume_store, parts)


async def _relay(
    upstream: UpstreamStream, builder: StreamBuilder, splice: Splicer, relay: Relay
) -> PrismError | None:
    """As the flight's own relay (``Flight._relay``), each event through the splice first:
    a loop of its own, so a healthy stream's relay has no splice step per event."""
    frames, usage = relay.frames, relay.usage_frames
    decoder = SSEDecoder()
    async for raw in upstream.events:
        for data in decoder.feed(raw):
            for event in splice.feed(data):
                try:
                    frame = builder.add(event)
                except PrismError as error:
                    return error
                if builder.usage:
                    usage.add(len(frames))
                if frame:
                    frames.append(frame)
                if builder.done:
                    relay.notify()
                    return None
        relay.notify()
    for event in splice.end():
        try:
            frame = builder.add(event)
        except PrismError as error:
            return error
        if frame:
            frames.append(frame)
    relay.notify()
    return None
