"""Azure OpenAI behind the OpenAI interface: OpenAI's bodies under Azure's URLs and keys.

The wire is the OpenAI-compatible adapter's, composed with Azure's URLs and credential
header: one ``OpenAICompatibleProvider`` per deployment, each calling through an
``_AzureURLs`` view of the provider's one connection pool, which puts the adapter's paths
(``/chat/completions``, ``/embeddings``) under the deployment's and adds the key (so the
OpenAI adapter itself, on OpenAI's hot path, is not touched). A deployment's URL is
``{base_url}/openai/deployments/{deployment}/chat/completions?api-version=…`` (and
``…/embeddings``); with ``api_version = "v1"`` it is ``{base_url}/openai/v1/chat/completions``
with the deployment as the body's ``model``. What is Azure's own in the answers (its
content filter's results) is taken out by ``azure_content``; a filtered answer is a
content-policy error. Provider table options (checked here, so a bad providers file fails
when the gateway is built):

- ``api_version``: a dated version (``"2024-10-21"``, the default; ``"…-preview"``
  allowed) or ``"v1"``;
- ``auth``: ``"api-key"`` (the default: the key in Azure's ``api-key`` header) or
  ``"entra-id"`` (the key is a Microsoft Entra ID access token, sent as a bearer token);
- ``deployments``: a table of target model -> deployment name (a model not in it is
  its own deployment's name).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncGenerator, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import orjson

from prism.sse import DONE, SSEDecoder

from .azure_content import answer_of, chunk_of
from .base import ListedModel, ProviderSpec, UpstreamCompletion, UpstreamStream
from .openai import OpenAICompatibleProvider
from .upstream_http import ErrorMapper, UpstreamHTTP, malformed

__all__ = ["AZURE_API_VERSION", "AzureOptions", "AzureProvider", "azure_options"]

AZURE_API_VERSION = "2024-10-21"  # the latest GA data-plane version with stream usage
_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}(?:-preview)?|v1")
_AUTH = ("api-key", "entra-id")
_OPTIONS = frozenset({"api_version", "auth", "deployments"})
_WIRES = 256  # deployments whose wire is kept (a "*" route passes any name on)


class AzureOptions:
    """A provider table's Azure settings, checked."""

    __slots__ = ("api_version", "auth", "deployments")

    def __init__(self, api_version: str, auth: str, deployments: Mapping[str, str]) -> None:
        self.api_version = api_version
        self.auth = auth
        self.deployments = dict(deployments)


def azure_options(spec: ProviderSpec) -> AzureOptions:
    """The spec's Azure options; ``ValueError`` naming what is wrong."""
    where = f"provider '{spec.name}'"
    options = spec.options
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ValueError(
            f"{where}: unknown keys {', '.join(sorted(unknown))} "
            f"(azure reads {', '.join(sorted(_OPTIONS))})"
        )
    version = options.get("api_version", AZURE_API_VERSION)
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise ValueError(f'{where}: api_version must be a date (2024-10-21) or "v1"')
    auth = options.get("auth", "api-key")
    if auth not in _AUTH:
        raise ValueError(f"{where}: auth must be one of {', '.join(_AUTH)}")
    deployments = options.get("deployments", {})
    if not isinstance(deployments, dict) or not all(
        isinstance(v, str) and v for v in deployments.values()
    ):
        raise ValueError(f'{where}: deployments must be a table of model = "deployment"')
    path = urlsplit(spec.base_url).path.rstrip("/")
    if path.endswith(("/openai", "/openai/v1")):
        raise ValueError(
            f"{where}: base_url is the resource's endpoint (https://NAME.openai.azure.com), "
            "without /openai: the adapter adds the path"
        )
    return AzureOptions(version, str(auth), deployments)


class _AzureURLs(UpstreamHTTP):
    """The provider's pool at one of Azure's URLs: a path the OpenAI adapter asks for goes
    to ``prefix + path + query``, with Azure's credential header added. A view, not a pool
    of its own (no ``UpstreamHTTP.__init__``): closing it leaves the pool to its provider."""

    def __init__(
        self, pool: UpstreamHTTP, prefix: str, query: str, auth: Mapping[str, str]
    ) -> None:
        self.spec = pool.spec
        self._pool, self._prefix, self._query, self._auth = pool, prefix, query, auth

    async def post(
        self,
        path: str,
        payload: bytes,
        headers: Mapping[str, str],
        errors: ErrorMapper | None = None,
    ) -> bytes:
        url = self._prefix + path + self._query
        return await self._pool.post(url, payload, {**headers, **self._auth}, errors)

    async def open_stream(
        self,
        path: str,
        payload: bytes,
        headers: Mapping[str, str],
        errors: ErrorMapper | None = None,
    ) -> aiohttp.ClientResponse:
        url = self._prefix + path + self._query
        return await self._pool.open_stream(url, payload, {**headers, **self._auth}, errors)

    async def aclose(self) -> None:
        return None  # the pool is the provider's to close


class AzureProvider:
    def __init__(self, spec: ProviderSpec, http: UpstreamHTTP | None = None) -> None:
        """``http``: the connection pool to call it through (``build_provider`` makes it)."""
        self.spec = spec
        self._http = http or UpstreamHTTP(spec)
        options = azure_options(spec)
        self._deployments = options.deployments
        self._version = options.api_version
        self._auth: dict[str, str] = {}
        if spec.api_key:
            bearer = options.auth == "entra-id"
            self._auth = (
                {"authorization": f"Bearer {spec.api_key}"} if bearer else {"api-key": spec.api_key}
            )
        # The key goes in Azure's header, added by the URLs' view: not as OpenAI's bearer.
        self._wire_spec = dataclasses.replace(spec, api_key=None)
        # v1: one wire for every deployment (named in the body); else one per deployment.
        self._v1: OpenAICompatibleProvider | None = None
        if self._version == "v1":
            self._v1 = self._make_wire("/openai/v1", "")
        self._wires: dict[str, OpenAICompatibleProvider] = {}

    def _make_wire(self, prefix: str, query: str) -> OpenAICompatibleProvider:
        urls = _AzureURLs(self._http, prefix, query, self._auth)
        return OpenAICompatibleProvider(self._wire_spec, urls)

    def _wire(self, model: str) -> tuple[OpenAICompatibleProvider, str]:
        """The wire to call for upstream ``model``, and its deployment's name."""
        deployment = self._deployments.get(model, model)
        if self._v1 is not None:
            return self._v1, deployment
        wire = self._wires.get(deployment)
        if wire is None:
            prefix = f"/openai/deployments/{quote(deployment, safe='')}"
            wire = self._make_wire(prefix, f"?api-version={self._version}")
            if len(self._wires) < _WIRES:
                self._wires[deployment] = wire
        return wire, deployment

    async def complete(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        wire, deployment = self._wire(model)
        answer = await wire.complete(body, deployment)
        completion = answer_of(answer.completion, self.spec.name)
        return UpstreamCompletion(body=orjson.dumps(completion), completion=completion)

    async def stream(self, body: dict[str, Any], model: str) -> UpstreamStream:
        wire, deployment = self._wire(model)
        upstream = await wire.stream(body, deployment)
        # The router waits for the first chunk this yields: the prompt's results are
        # dropped first, and a filter that cuts the answer at once fails before the 200.
        return UpstreamStream(events=self._events(upstream), close=upstream.close)

    async def embed(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        """``POST …/embeddings``: Azure's vectors are OpenAI's list, passed on as sent."""
        wire, deployment = self._wire(model)
        return await wire.embed(body, deployment)

    async def models(self) -> list[ListedModel]:
        """The models its ``deployments`` table names: what this resource serves. (Azure's
        own model list is every model the region offers, deployed or not; its deployments
        are listed only by the management API, with other credentials.)"""
        return [ListedModel(id=model, owned_by="azure") for model in self._deployments]

    async def _events(self, upstream: UpstreamStream) -> AsyncGenerator[bytes, None]:
        """Azure's SSE bytes in, OpenAI's out: one yield per read that leaves a chunk."""
        decoder = SSEDecoder()
        name = self.spec.name
        try:
            async for raw in upstream.events:
                out: list[bytes] = []
                for data in decoder.feed(raw):
                    if data == b"[DONE]":
                        out.append(DONE)
                        continue
                    try:
                        chunk = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        raise malformed(self.spec, "a malformed stream event") from None
                    if not isinstance(chunk, dict):
                        raise malformed(self.spec, "a malformed stream event")
                    plain = chunk_of(chunk, name)
                    if plain is not None:
                        out.append(b"data: " + orjson.dumps(plain) + b"\n\n")
                if out:
                    yield b"".join(out)
        finally:
            await upstream.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
