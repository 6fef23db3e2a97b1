"""Azure OpenAI's wire format in the local provider: a resource's deployments, its checks,
and OpenAI's answers with Azure's content-filter annotations.

Apart from OpenAI's (``provider_openai``), whose ``ScriptedReply`` answers it puts in
Azure's form: the checks a resource makes before any answer (``azure_denied``: the
``api-key`` header or an Entra ID bearer token, then the ``api-version`` the URL form
needs; ``azure_checked``: the deployment, from the URL or, under ``/openai/v1``, the
body's ``model``, and the prompt filter), then the answer with ``prompt_filter_results``
and per-choice ``content_filter_results``; a stream opens with the prompt's results alone
(``choices: []``, empty ``id`` and ``model``) and carries one chunk of annotations alone,
as asynchronous filtering sends. The resource's deployments are named after the settings'
models, plus two embedding models.

Its content filter: a prompt containing ``FILTER_PROMPT`` is refused (400
``content_filter`` with Azure's ``innererror``); an answer echoing ``FILTER_ANSWER`` is
cut (``finish_reason: "content_filter"``, the category marked ``filtered``).
"""

from __future__ import annotations

import hmac
import re
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from deploy.local.provider_faults import error_response, json_response
from deploy.local.provider_openai import openai_completion, openai_stream
from deploy.local.provider_replies import ScriptedReply
from deploy.local.provider_settings import ProviderSettings
from deploy.local.provider_sse import StreamPlan, sse

__all__ = [
    "AZURE_EMBEDDING_DEPLOYMENTS",
    "FILTER_ANSWER",
    "FILTER_PROMPT",
    "azure_checked",
    "azure_completion",
    "azure_denied",
    "azure_stream",
]

AZURE_EMBEDDING_DEPLOYMENTS = ("text-embedding-3-small", "text-embedding-3-large")
FILTER_PROMPT = "prism-filter-prompt"
FILTER_ANSWER = "prism-filter-answer"

_DATED = re.compile(r"\d{4}-\d{2}-\d{2}(?:-preview)?")
_CATEGORIES = ("hate", "self_harm", "sexual", "violence")
_SAFE = {name: {"filtered": False, "severity": "safe"} for name in _CATEGORIES}
_FLAGGED = {**_SAFE, "violence": {"filtered": True, "severity": "medium"}}
_ACCESS_DENIED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
    "provide a valid key for an active subscription and use a correct regional API "
    "endpoint for your resource."
)
_NO_DEPLOYMENT = (
    "The API deployment for this resource does not exist. If you created the deployment "
    "within the last 5 minutes, please wait a moment and try again."
)
_PROMPT_FILTERED = (
    "The response was filtered due to the prompt triggering Azure OpenAI's content "
    "management policy. Please modify your prompt and retry."
)


def azure_denied(request: Request, settings: ProviderSettings) -> Response | None:
    """A resource's first checks: a credential (``api-key``, else a bearer token), then
    an ``api-version`` the URL's form accepts."""
    headers, key = request.headers, settings.api_key
    given = headers.get("api-key")
    if given is None:
        bearer = headers.get("authorization", "")
        given = bearer[len("Bearer ") :] if bearer.startswith("Bearer ") else ""
    if not given or (key is not None and not hmac.compare_digest(given.encode(), key.encode())):
        return error_response("azure", 401, _ACCESS_DENIED)
    version = request.query_params.get("api-version")
    if "deployment" in request.path_params:
        # The deployments form is versioned: without a known version there is no route.
        if version is None or not _DATED.fullmatch(version):
            return error_response("azure", 404, "Resource not found")
    elif version not in (None, "preview", "latest"):
        return error_response("azure", 400, f"API version '{version}' is not supported.")
    return None


def _prompt_text(body: dict[str, Any]) -> str:
    return orjson.dumps(body.get("messages", body.get("input"))).decode()


def azure_checked(
    request: Request, body: dict[str, Any], settings: ProviderSettings
) -> dict[str, Any] | Response:
    """The body with its deployment as ``model`` (what the answer names), or the error a
    resource answers: an unknown deployment, or a prompt its filter refuses."""
    deployment = request.path_params.get("deployment", body.get("model"))
    if not isinstance(deployment, str) or not deployment:
        return error_response("azure", 400, "'model' is required (the deployment's name).")
    if deployment not in (*settings.models, *AZURE_EMBEDDING_DEPLOYMENTS):
        not_found = {"code": "DeploymentNotFound", "message": _NO_DEPLOYMENT}
        return json_response({"error": not_found}, 404)
    if FILTER_PROMPT in _prompt_text(body):
        error = {
            "message": _PROMPT_FILTERED,
            "type": None,
            "param": "prompt",
            "code": "content_filter",
            "status": 400,
            "innererror": {
                "code": "ResponsibleAIPolicyViolation",
                "content_filter_result": _FLAGGED,
            },
        }
        return json_response({"error": error}, 400)
    return {**body, "model": deployment}


def _filtered(reply: ScriptedReply) -> bool:
    return any(FILTER_ANSWER in text for text in reply.texts)


def azure_completion(reply: ScriptedReply, created: int) -> dict[str, Any]:
    """OpenAI's completion with the filter's results; a filtered answer has no content."""
    completion = openai_completion(reply, created)
    flagged = _filtered(reply)
    for choice in completion["choices"]:
        choice["content_filter_results"] = _FLAGGED if flagged else _SAFE
        if flagged:
            choice["finish_reason"] = "content_filter"
            choice["message"]["content"] = None
    prompt = [{"prompt_index": 0, "content_filter_results": _SAFE}]
    return {**completion, "prompt_filter_results": prompt}


def _annotated(event: bytes, results: dict[str, Any]) -> bytes:
    """An OpenAI chunk event with ``results`` on each of its choices."""
    chunk = orjson.loads(event.removeprefix(b"data: "))
    for choice in chunk["choices"]:
        choice["content_filter_results"] = results if choice["delta"].get("content") else {}
    return sse(chunk)


def azure_stream(
    settings: ProviderSettings, reply: ScriptedReply, created: int, include_usage: bool
) -> StreamPlan:
    """OpenAI's stream, annotated as Azure streams it; a filtered answer stops after its
    first words with ``finish_reason: "content_filter"``."""
    plan = openai_stream(settings, reply, created, include_usage)
    events, terminal = plan.events, plan.terminal
    prompt = {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": _SAFE}],
    }
    body = [(_annotated(e, _SAFE), w) for e, w in events[:terminal]]
    tail = events[terminal:]
    if _filtered(reply):
        base = orjson.loads(events[0][0].removeprefix(b"data: "))
        cut = {"index": 0, "delta": {}, "finish_reason": "content_filter"}
        cut["content_filter_results"] = _FLAGGED
        body = body[:2]
        tail = [(sse({**base, "choices": [cut]}), 0), *tail[len(reply.texts) :]]
    annotations = {
        "id": "",
        "object": "",
        "created": 0,
        "model": "",
        "choices": [
            {
                "index": 0,
                "finish_reason": None,
                "content_filter_results": _SAFE,
                "content_filter_offsets": {"check_offset": 0, "start_offset": 0, "end_offset": 1},
            }
        ],
    }
    out = [(sse(prompt), 0), *body, (sse(annotations), 0), *tail]
    return StreamPlan(out, len(body) + 2)
