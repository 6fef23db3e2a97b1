"""Prism's origin: the Redis-backed, provider-calling half of the gateway.

The names below are imported when first used, not with the package: a tool that needs
one part of the origin (the CLI's policy store, its audit records) does not load the
whole app, its providers and its HTTP clients with it.
"""

from __future__ import annotations

import importlib
import typing

if typing.TYPE_CHECKING:
    from .app import create_app
    from .settings import Settings, SettingsError

__all__ = ["Settings", "SettingsError", "create_app"]

_HOMES = {"create_app": ".app", "Settings": ".settings", "SettingsError": ".settings"}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'origin' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # once: later reads are plain attribute reads
    return value
