"""Paths and URLs that more than one part of Prism names (the edge, the origin, the CLI,
the benchmark): each defined here, once."""

from __future__ import annotations

__all__ = [
    "CHAT_PATH",
    "CLOUDFLARE_API_URL",
    "DEFAULT_REDIS_URL",
    "EMBEDDINGS_PATH",
    "HEALTH_PATH",
    "MESSAGES_PATH",
    "MODELS_KEY",
    "MODELS_PATH",
    "REQUEST_LOG_PATH",
    "RESPONSES_PATH",
]

# Each API path is also part of every fingerprint made for it: never change one.
CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
MESSAGES_PATH = "/v1/messages"  # Anthropic's Messages API
RESPONSES_PATH = "/v1/responses"  # OpenAI's Responses API
MODELS_PATH = "/v1/models"
# The origin's liveness on its public port: answered from its event loop, no I/O; the
# edge probes it when an answer is slow to start, load balancers check it.
HEALTH_PATH = "/healthz"
# Where the edge sends the records of the requests it answered itself (KV hits, refusals):
# the origin's public port, signed like a forward, never an API a key can call.
REQUEST_LOG_PATH = "/prism/request-log"
MODELS_KEY = "prism:models"  # the origin's model list, published to Workers KV for the edge
CLOUDFLARE_API_URL = "https://api.cloudflare.com/client/v4"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"  # the origin's and `prism keys`' default
