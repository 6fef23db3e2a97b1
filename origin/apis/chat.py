"""``POST /v1/chat/completions``: the chat API's part of the governed path.

Everything a request goes through (auth, one Redis round trip, policy, rate limits, the
budget, coalescing, usage) is ``origin.apis.pipeline``'s, shared with every other API; what
is chat's is here: its parser, its token bounds, its stream replay (with the usage chunk
only when asked for) and its semantic layer. The flight calls providers for it with
its own code (``op=None``).
"""

from __future__ import annotations

from prism import ChatRequest, Envelope, parse_chat_request, replay
from prism.routes import CHAT_PATH

from ..gateway import Gateway
from ..governance.project_policies import ProjectPolicies
from ..governance.token_bounds import completion_token_bound, prompt_token_bound
from ..store.semantic import question
from .pipeline import CLIENT_GONE, JSON, SSE, Api, ApiRoute

__all__ = ["CHAT", "CLIENT_GONE", "JSON", "SSE", "ChatCompletions"]


def _stream_hit(envelope: Envelope, chat: ChatRequest) -> bytes:
    return replay(envelope.completion(), chat.include_usage)


def _include_usage(chat: ChatRequest) -> bool:
    return chat.include_usage


CHAT: Api[ChatRequest] = Api(
    CHAT_PATH,
    parse_chat_request,
    None,
    prompt_token_bound,
    completion_token_bound,
    _stream_hit,
    _include_usage,
    question,
    audit_path=False,
)


class ChatCompletions(ApiRoute[ChatRequest]):
    def __init__(self, gateway: Gateway, policies: ProjectPolicies | None = None) -> None:
        super().__init__(gateway, CHAT, policies)
