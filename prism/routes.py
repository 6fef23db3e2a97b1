"""Paths and URLs that more than one part of Prism names (the edge, the origin, the CLI,
the benchmark): each defined here, once."""

from __future__ import annotations

__all__ = ["CHAT_PATH", "CLOUDFLARE_API_URL", "DEFAULT_REDIS_URL", "MODELS_PATH"]

CHAT_PATH = "/v1/chat/completions"  # also part of every fingerprint: never change it
MODELS_PATH = "/v1/models"
CLOUDFLARE_API_URL = "https://api.cloudflare.com/client/v4"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"  # the origin's and `prism keys`' default
