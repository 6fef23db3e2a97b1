"""Paths and base URLs that more than one part of Prism names: defined here, once."""

from __future__ import annotations

__all__ = ["CHAT_PATH", "CLOUDFLARE_API_URL", "MODELS_PATH"]

CHAT_PATH = "/v1/chat/completions"  # also part of every fingerprint: never change it
MODELS_PATH = "/v1/models"
CLOUDFLARE_API_URL = "https://api.cloudflare.com/client/v4"
