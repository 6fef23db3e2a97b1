"""Prism's origin: the Redis-backed, provider-calling half of the gateway."""

from .app import create_app
from .settings import Settings, SettingsError

__all__ = ["Settings", "SettingsError", "create_app"]
