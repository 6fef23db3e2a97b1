"""``/v1/responses/{id}`` at the PoP (``GET``, ``DELETE``; its ``input_items`` and ``cancel``):
a response a provider keeps for the project that asked (``store: true``) is the origin's to
find, so the request is passed on, signed for its own path, and the origin's answer relayed.
Nothing of it is cached.
"""

from __future__ import annotations

from collections.abc import Callable

from prism import KeyIdentity, MethodNotAllowedError, PrismError, error_json

from .forward import OriginForwarder
from .platform import EdgeRequest, EdgeResponse, Platform
from .request_log import RequestNote
from .routes import ROUTES, STORED_RESPONSES, normal_path, stored_response_methods

__all__ = ["StoredResponsesRoute"]


class StoredResponsesRoute:
    __slots__ = ("_forwarder", "error_body", "key_header", "methods")

    def __init__(self, forwarder: OriginForwarder) -> None:
        self.methods = ROUTES[STORED_RESPONSES]
        self.key_header: str | None = None
        self.error_body: Callable[[PrismError], bytes] = error_json
        self._forwarder = forwarder

    async def serve(
        self,
        request: EdgeRequest,
        platform: Platform,
        identity: KeyIdentity,
        note: RequestNote,
    ) -> EdgeResponse:
        path = normal_path(request.path)  # the handler matched it: a stored response's
        if request.method not in stored_response_methods(path):
            raise MethodNotAllowedError(f"Method {request.method[:20]} is not allowed here.")
        return await self._forwarder.forward(
            request.method, path, request, platform, identity, "", None, note
        )
