"""The local provider's ASGI app: OpenAI's chat completions, responses, embeddings and
models, Anthropic's messages and models, Azure OpenAI's deployments, Google Gemini's
generateContent and Bedrock's Converse, each answer delayed, paced and spoiled as its fault
says.

The handlers check a request as the real API would (its key, its headers, its body), read
it into a reply (``provider_replies``), put that in the API's format (``provider_openai``,
``provider_anthropic``, ``provider_responses``, ``provider_azure``, ``provider_gemini``,
``provider_bedrock``) and send it, whole or as a paced event stream (``provider_sse``).
Apart from the control endpoints (faults, counters, recent requests: ``provider_faults``)
and from running the app (a thread, a port, the command line: ``deploy.local.provider``):
this module is the serving alone, one app instance with all its state on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from deploy.local.provider_anthropic import anthropic_message, anthropic_stream
from deploy.local.provider_azure import azure_checked, azure_completion, azure_denied, azure_stream
from deploy.local.provider_bedrock import (
    EVENT_STREAM,
    BedrockRejection,
    bedrock_error_response,
    bedrock_fault_response,
    bedrock_stream,
    check_bedrock,
    check_titan,
    converse_answer,
)
from deploy.local.provider_faults import (
    Api,
    Fault,
    ProviderState,
    control_routes,
    error_response,
    fault_error_response,
    header_fault,
)
from deploy.local.provider_gemini import (
    GeminiCall,
    gemini_call,
    gemini_embeddings,
    gemini_fault_response,
    gemini_json_stream,
    gemini_models,
    gemini_response,
    gemini_stream,
)
from deploy.local.provider_models import anthropic_model_page, openai_model_list
from deploy.local.provider_openai import openai_completion, openai_embeddings, openai_stream
from deploy.local.provider_replies import (
    ScriptedReply,
    anthropic_reply,
    continued_reply,
    openai_reply,
    responses_reply,
)
from deploy.local.provider_responses import responses_object, responses_stream
from deploy.local.provider_settings import ProviderSettings
from deploy.local.provider_sse import (
    MALFORMED_JSON,
    StreamPlan,
    error_event,
    malformed_stream,
    without_done,
)

__all__ = ["create_provider_app"]


class _Provider:
    """Request handlers over one settings object and one per-app state."""

    def __init__(self, settings: ProviderSettings, state: ProviderState) -> None:
        self.settings = settings
        self.state = state

    async def models(self, request: Request) -> Response:
        """OpenAI's model list, with an ``anthropic-version`` header Anthropic's page
        (``provider_models``), with a Google key Gemini's; OpenAI's and Anthropic's faults
        come from the models queue."""
        state, settings = self.state, self.settings
        if "x-goog-api-key" in request.headers or "key" in request.query_params:
            return gemini_models("v1", request.headers, request.query_params, settings.api_key)
        release = state.release
        api: Api = "anthropic" if "anthropic-version" in request.headers else "openai"
        denied = self._denied(request, api)
        if denied is not None:
            return denied
        try:
            if api == "anthropic":
                data = anthropic_model_page(
                    settings.anthropic_models, request.query_params, settings.models_page_size
                )
            else:
                data = openai_model_list(settings.models)
            fault = header_fault(request.headers) or state.model_faults.take()
        except ValueError as exc:
            return error_response(api, 400, str(exc))
        state.stats.model_lists[api] += 1
        if fault is not None:
            state.stats.model_list_faults += 1
        await self._before_first_byte(fault, False, release)
        if fault is not None and fault.mode in ("status", "rate_limit"):
            return fault_error_response(api, fault)
        return _plain(orjson.dumps(data), fault)

    async def chat_completions(self, request: Request) -> Response:
        return await self._chat(request, "openai")

    async def messages(self, request: Request) -> Response:
        return await self._chat(request, "anthropic")

    async def responses(self, request: Request) -> Response:
        return await self._chat(request, "openai", responses=True)

    async def stored_response(self, request: Request) -> Response:
        """``GET`` or ``DELETE /v1/responses/{id}``: a response kept with ``store: true``."""
        denied = self._denied(request, "openai")
        if denied is not None:
            return denied
        ident = request.path_params["response_id"]
        kept = self.state.stored.get(ident)
        if kept is None:
            return error_response("openai", 404, f"No response found with id '{ident}'.")
        if request.method == "DELETE":
            del self.state.stored[ident]
            return JSONResponse({"id": ident, "object": "response.deleted", "deleted": True})
        return JSONResponse(kept)

    async def azure_chat(self, request: Request) -> Response:
        return await self._chat(request, "azure")

    async def embeddings(self, request: Request) -> Response:
        return await self._embeddings(request, "openai")

    async def azure_embeddings(self, request: Request) -> Response:
        return await self._embeddings(request, "azure")

    async def _embeddings(self, request: Request, api: Api) -> Response:
        """Deterministic vectors (``openai_embeddings``, Azure's too); the same faults as
        chat, but those of streams (an embedding is never streamed)."""
        state = self.state
        state.stats.paths[request.url.path] += 1
        release = state.release  # a release from now on ends this request's stall
        raw = await request.body()
        denied = self._denied(request, api)
        if denied is not None:
            return denied
        try:
            body = orjson.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("The request body must be a JSON object.")
            if api == "azure":
                checked = azure_checked(request, body, self.settings)
                if isinstance(checked, Response):
                    return checked
                body = checked
            answer = openai_embeddings(body)
            fault = header_fault(request.headers) or state.faults.take()
        except (orjson.JSONDecodeError, ValueError) as exc:
            return error_response(api, 400, str(exc))
        state.recent.append({"method": "POST", "path": request.url.path, "body": body})
        state.record(fault, False)
        await self._before_first_byte(fault, False, release)
        if fault is not None and fault.mode in ("status", "rate_limit"):
            return fault_error_response(api, fault)
        return _plain(orjson.dumps(answer), fault)

    async def gemini(self, request: Request) -> Response:
        """Gemini's ``POST /{version}/models/{model}:{method}`` (``provider_gemini``): the
        same faults as chat (a stream's own for ``streamGenerateContent``)."""
        state = self.state
        state.stats.paths[request.url.path] += 1
        release = state.release  # a release from now on ends this request's stall
        raw = await request.body()
        params = request.path_params
        call = gemini_call(
            self.settings,
            params["version"],
            params["target"],
            request.headers,
            request.query_params,
            raw,
        )
        if not isinstance(call, GeminiCall):
            return call
        if call.reply is not None:
            state.stats.chat_requests += 1
        state.recent.append(
            {"method": "POST", "path": request.url.path, "query": str(request.query_params),
             "headers": dict(request.headers), "body": call.body}
        )  # fmt: skip
        try:
            fault = header_fault(request.headers) or state.faults.take()
        except ValueError as exc:
            return error_response("openai", 400, str(exc))
        streamed = call.stream and call.sse
        state.record(fault, streamed)
        await self._before_first_byte(fault, streamed, release)
        if fault is not None and fault.mode in ("status", "rate_limit"):
            return gemini_fault_response(fault)
        if call.reply is None:
            answer = gemini_embeddings(call.model, call.method, call.body)
            return _plain(orjson.dumps(answer), fault)
        if not call.stream:
            return _plain(orjson.dumps(gemini_response(call.reply)), fault)
        if not call.sse:
            return _plain(gemini_json_stream(self.settings, call.reply), fault)
        events = self._emit(gemini_stream(self.settings, call.reply, fault), fault)
        if fault is not None and fault.mode == "truncated_stream" and fault.abort:
            return _CutResponse(events, "text/event-stream")
        return StreamingResponse(events, media_type="text/event-stream", headers=_SSE_HEADERS)

    async def gemini_models(self, request: Request) -> Response:
        self.state.stats.paths[request.url.path] += 1
        version = request.path_params["version"]
        key = self.settings.api_key
        return gemini_models(version, request.headers, request.query_params, key)

    async def converse(self, request: Request) -> Response:
        """Bedrock's Converse and ConverseStream (``provider_bedrock``): the same faults."""
        state = self.state
        state.stats.chat_requests += 1
        state.stats.paths[request.url.path] += 1
        release = state.release  # a release from now on ends this request's stall
        raw = await request.body()
        try:
            body, reply = check_bedrock(request, raw, self.settings)
            fault = header_fault(request.headers) or state.faults.take()
        except BedrockRejection as rejection:
            return rejection.response
        except ValueError as exc:  # a bad x-fault-* header
            return bedrock_error_response(400, str(exc))
        record = {"method": "POST", "path": request.url.path, "headers": dict(request.headers)}
        state.recent.append({**record, "body": body})
        stream = request.url.path.endswith("/converse-stream")
        state.record(fault, stream)
        await self._before_first_byte(fault, stream, release)
        if fault is not None and fault.mode in ("status", "rate_limit"):
            return bedrock_fault_response(fault)
        if not stream:
            return _plain(orjson.dumps(converse_answer(reply)), fault)
        events = self._emit(bedrock_stream(self.settings, reply, fault), fault)
        if fault is not None and fault.mode == "truncated_stream" and fault.abort:
            return _CutResponse(events, EVENT_STREAM)
        return StreamingResponse(events, media_type=EVENT_STREAM)

    async def invoke(self, request: Request) -> Response:
        """Bedrock's InvokeModel for Titan text embeddings: the faults of a JSON answer."""
        state = self.state
        state.stats.paths[request.url.path] += 1
        release = state.release  # a release from now on ends this request's stall
        raw = await request.body()
        try:
            body, answer = check_titan(request, raw, self.settings)
            fault = header_fault(request.headers) or state.faults.take()
        except BedrockRejection as rejection:
            return rejection.response
        except ValueError as exc:  # a bad x-fault-* header
            return bedrock_error_response(400, str(exc))
        state.recent.append({"method": "POST", "path": request.url.path, "body": body})
        state.record(fault, False)
        await self._before_first_byte(fault, False, release)
        if fault is not None and fault.mode in ("status", "rate_limit"):
            return bedrock_fault_response(fault)
        return _plain(orjson.dumps(answer), fault)

    def _denied(self, request: Request, api: Api) -> Response | None:
        headers, key = request.headers, self.settings.api_key
        if api == "anthropic":
            # The key as x-api-key, or as a bearer token (how the anthropic SDK 2.x sends it).
            bearer = headers.get("authorization", "")
            given = headers.get("x-api-key") or (bearer[7:] if bearer[:7] == "Bearer " else None)
            if given is None or (key is not None and not _same(given, key)):
                return error_response(api, 401, "invalid x-api-key")
            if "anthropic-version" not in headers:
                return error_response(api, 400, "anthropic-version: header is required")
        elif api == "azure":
            return azure_denied(request, self.settings)
        elif key is not None and not _same(headers.get("authorization", ""), f"Bearer {key}"):
            return error_response(api, 401, "Incorrect API key provided.")
        return None

    async def _chat(self, request: Request, api: Api, responses: bool = False) -> Response:
        state, settings = self.state, self.settings
        state.stats.chat_requests += 1
        state.stats.paths[request.url.path] += 1
        release = state.release  # a release from now on ends this request's stall
        raw = await request.body()
        denied = self._denied(request, api)
        if denied is not None:
            return denied
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return error_response(api, 400, "The request body is not valid JSON.")
        if not isinstance(body, dict):
            return error_response(api, 400, "The request body must be a JSON object.")
        state.recent.append(
            {
                "method": request.method,
                "path": request.url.path,
                "headers": dict(request.headers),
                "body": body,
            }
        )
        if api == "azure":
            checked = azure_checked(request, body, settings)
            if isinstance(checked, Response):
                return checked
            body = checked
        try:
            if responses:
                reply = responses_reply(settings, body)
            else:
                kind: Literal["openai", "anthropic"] = (
                    "anthropic" if api == "anthropic" else "openai"
                )
                read = anthropic_reply if api == "anthropic" else openai_reply
                reply = continued_reply(settings, kind, body, read)
            fault = header_fault(request.headers) or state.faults.take()
        except ValueError as exc:
            return error_response(api, 400, str(exc))
        stream = body.get("stream") is True
        state.record(fault, stream)
        await self._before_first_byte(fault, stream, release)
        if fault is not None and fault.mode in ("status", "rate_limit"):
            return fault_error_response(api, fault)
        return self._answer(api, body, reply, fault, stream, responses)

    async def _before_first_byte(
        self, fault: Fault | None, stream: bool, release: asyncio.Event
    ) -> None:
        """The wait before the answer's first byte: the settings' latency and a ``latency``
        fault are waited out; a stall before the first byte lasts its ``seconds`` or until
        ``release`` is set (``/_control/release``), whichever comes first."""
        latency = self.settings.latency_ms / 1000
        if fault is not None and fault.mode == "latency":
            latency += fault.ms / 1000
        if latency > 0:
            await asyncio.sleep(latency)
        stall = _stall_before_first_byte(fault, stream)
        if stall > 0:
            with contextlib.suppress(TimeoutError):  # else released early
                await asyncio.wait_for(release.wait(), stall)

    def _answer(
        self,
        api: Api,
        body: dict[str, Any],
        reply: ScriptedReply,
        fault: Fault | None,
        stream: bool,
        responses: bool = False,
    ) -> Response:
        """The reply as JSON or as an event stream, spoiled as the fault says."""
        settings = self.settings
        created = int(time.time())
        mode = fault.mode if fault is not None else None
        if responses and body.get("store", True) is True:
            kept = responses_object(reply, body, created)
            self.state.stored[kept["id"]] = kept
        if not stream:
            if responses:
                data = responses_object(reply, body, created)
            elif api == "anthropic":
                data = anthropic_message(reply)
            else:
                data = (azure_completion if api == "azure" else openai_completion)(reply, created)
            return _plain(orjson.dumps(data), fault)
        if responses:
            plan = responses_stream(settings, reply, body, created)
        elif api == "anthropic":
            plan = anthropic_stream(settings, reply)
        else:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            plan = (azure_stream if api == "azure" else openai_stream)(
                settings, reply, created, include_usage
            )
        if mode == "malformed_json":
            plan = malformed_stream(api, plan)
        elif mode == "no_done":
            plan = without_done(plan)
        elif mode == "error_event":
            assert fault is not None
            plan = error_event(api, fault.message)
        events = self._emit(plan, fault)
        if mode == "truncated_stream" and fault is not None and fault.abort:
            return _CutResponse(events, "text/event-stream")
        return StreamingResponse(events, media_type="text/event-stream", headers=_SSE_HEADERS)

    async def _emit(self, plan: StreamPlan, fault: Fault | None) -> AsyncIterator[bytes]:
        """Yield each event as its own write, paced by tokens_per_second."""
        stop_at = stall_at = -1
        if fault is not None and fault.mode == "truncated_stream":
            stop_at = min(fault.after_chunks, plan.terminal)
        elif fault is not None and fault.mode == "stall_mid_stream":
            stall_at = min(fault.after_chunks, len(plan.events) - 1)
        elif fault is not None and fault.mode == "stall_after_headers":
            stall_at = 0  # the headers are already out: silence before the first event
        rate = self.settings.tokens_per_second
        # Bound once: a reset while this stream is open must not skew the new counters.
        stats = self.state.stats
        stats.open_streams += 1
        finished = False
        try:
            started, words = time.monotonic(), 0
            for i, (event, weight) in enumerate(plan.events):
                if i == stop_at:
                    break
                if i == stall_at:
                    assert fault is not None
                    with contextlib.suppress(TimeoutError):  # else released early
                        await asyncio.wait_for(self.state.release.wait(), fault.seconds)
                    started = time.monotonic() - words / rate if rate else started
                if rate and weight:
                    # Pace against a schedule, not per chunk, so sleeps do not drift.
                    words += weight
                    wait = started + words / rate - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                yield event
            finished = True
        finally:
            stats.open_streams -= 1
            if finished:
                stats.streams_completed += 1
            else:
                stats.streams_aborted += 1


_SSE_HEADERS = {"cache-control": "no-cache"}


class _CutResponse(Response):
    """Headers and part of a body, then the connection drops (the body never ends).

    Returning without the final ``more_body=False`` message makes the server close the
    connection, which is what a provider crashing mid-answer looks like on the wire.
    """

    def __init__(
        self, parts: AsyncIterator[bytes], media_type: str, *, content_length: int | None = None
    ) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", media_type.encode())]
        if content_length is not None:
            self.raw_headers.append((b"content-length", str(content_length).encode()))
        self._parts = parts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async for part in self._parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})


def _plain(payload: bytes, fault: Fault | None) -> Response:
    """A JSON answer, spoiled as the fault says."""
    mode = fault.mode if fault is not None else None
    if mode == "malformed_json":
        payload = MALFORMED_JSON
    elif mode == "truncated_stream":
        assert fault is not None
        if fault.abort:
            # Promise the whole body, send half, hang up.
            half = _once(payload[: len(payload) // 2])
            return _CutResponse(half, "application/json", content_length=len(payload))
        payload = payload[: len(payload) // 2]
    elif mode == "stall_after_headers":
        assert fault is not None
        return StreamingResponse(_after(fault.seconds, payload), media_type="application/json")
    return Response(payload, media_type="application/json")


async def _once(payload: bytes) -> AsyncIterator[bytes]:
    yield payload


async def _after(seconds: float, payload: bytes) -> AsyncIterator[bytes]:
    """``payload`` after ``seconds`` of silence (the headers have gone out already)."""
    await asyncio.sleep(seconds)
    yield payload


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods, in OpenAI's error format rather than plain text."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    return error_response("openai", status, f"{request.method} {request.url.path}: {exc}")


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _stall_before_first_byte(fault: Fault | None, stream: bool) -> float:
    """Seconds a fault stalls the answer before its first byte (a mid-stream stall asked
    of a JSON answer stalls it before its first byte)."""
    if fault is None:
        return 0.0
    if fault.mode == "stall_before_first_byte" or (fault.mode == "stall_mid_stream" and not stream):
        return fault.seconds
    return 0.0


def create_provider_app(settings: ProviderSettings | None = None) -> Starlette:
    """The provider as an ASGI app; all mutable state lives on this instance."""
    settings = settings or ProviderSettings()
    state = ProviderState()
    provider = _Provider(settings, state)
    routes = [
        Route("/v1/chat/completions", provider.chat_completions, methods=["POST"]),
        Route("/v1/messages", provider.messages, methods=["POST"]),
        Route("/v1/responses", provider.responses, methods=["POST"]),
        Route("/v1/responses/{response_id}", provider.stored_response, methods=["GET", "DELETE"]),
        Route("/v1/embeddings", provider.embeddings, methods=["POST"]),
        Route("/v1/models", provider.models, methods=["GET"]),
        # Azure OpenAI: a resource's deployments, and its v1 form naming them in the body
        Route(
            "/openai/deployments/{deployment}/chat/completions",
            provider.azure_chat,
            methods=["POST"],
        ),
        Route(
            "/openai/deployments/{deployment}/embeddings",
            provider.azure_embeddings,
            methods=["POST"],
        ),
        Route("/openai/v1/chat/completions", provider.azure_chat, methods=["POST"]),
        Route("/openai/v1/embeddings", provider.azure_embeddings, methods=["POST"]),
        Route("/{version}/models", provider.gemini_models, methods=["GET"]),
        Route("/{version}/models/{target}", provider.gemini, methods=["POST"]),
        Route("/model/{model_id:path}/converse", provider.converse, methods=["POST"]),
        Route("/model/{model_id:path}/converse-stream", provider.converse, methods=["POST"]),
        Route("/model/{model_id:path}/invoke", provider.invoke, methods=["POST"]),
        *control_routes(state),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    app.state.provider = state  # for in-process tests that want to look inside
    return app
