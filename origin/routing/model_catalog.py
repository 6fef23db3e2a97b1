"""The models ``/v1/models`` lists: the named routes, and what the providers behind the
wildcard routes list themselves.

A route without a wildcard is listed by its name. A wildcard route (``"*"``, ``"gpt-*"``)
sends the requested name through to its targets, so what it really serves is what those
providers serve: the catalog asks each of them for its own list (``ModelLister.models``:
OpenAI's ``GET /models``, Anthropic's paged ``GET /v1/models``) and lists each model the
configuration would route there, i.e. whose route (``ProviderConfig.route``) is that
wildcard route and which a pass-through target of it lists. A name a client could not
send (``prism.request.model_name``) is left out.

The origin refreshes it in the background (``Gateway``): at start and every
``PRISM_MODELS_REFRESH_INTERVAL`` seconds, never on a request's path. A provider whose
fetch fails keeps its last list (logged, and counted in ``prism_model_list_fetches``).
Bodies are rendered once per change, and once per policy (policies are few).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import orjson

from prism import InvalidRequestError, Policy, PrismError
from prism.request import model_name

from ..metrics import Metrics
from ..providers.base import ChatProvider, ListedModel, ModelLister
from ..providers.config import ModelRoute, ProviderConfig

__all__ = ["FETCH_TIMEOUT", "ModelCatalog"]

log = logging.getLogger("prism.origin")

FETCH_TIMEOUT = 30.0  # seconds for one provider's whole list (all its pages)
_OWNER = "prism"  # owned_by of a named route: a name this gateway gives
_MAX_BODIES = 256  # policies rendered for (cleared when full)


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def _exact(name: str) -> bool:
    try:
        model_name(name)
    except InvalidRequestError:
        return False
    return True


class ModelCatalog:
    """The public model list, kept current by ``refresh``; read per request by ``body``."""

    def __init__(
        self,
        config: ProviderConfig,
        providers: Mapping[str, ChatProvider],
        metrics: Metrics,
        created: float,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._named = [name for name in config.routes if not _is_pattern(name)]
        self._created = int(created)
        # The wildcard routes, in the configuration's order, and their pass-through targets.
        self._wildcards: list[tuple[ModelRoute, tuple[str, ...]]] = []
        listers: dict[str, ModelLister] = {}
        for pattern, route in config.routes.items():
            if not _is_pattern(pattern):
                continue
            names = tuple(dict.fromkeys(t.provider for t in route.targets if t.model is None))
            self._wildcards.append((route, names))
            for name in names:
                provider = providers.get(name)
                if isinstance(provider, ModelLister):
                    listers[name] = provider
        self._listers = listers
        self._listed: dict[str, list[ListedModel]] = {}  # by provider: its last good list
        self._bodies: dict[Policy | None, bytes] = {}
        self._entries: list[dict[str, Any]] = []
        self._render()

    @property
    def sources(self) -> tuple[str, ...]:
        """The providers whose own lists the catalog reads (none: a static list)."""
        return tuple(self._listers)

    @property
    def names(self) -> list[str]:
        return [entry["id"] for entry in self._entries]

    def body(self, policy: Policy | None) -> bytes:
        """``/v1/models``'s body as ``policy`` allows it (None: every model listed)."""
        body = self._bodies.get(policy)
        if body is None:
            entries = self._entries
            if policy is not None:
                entries = [entry for entry in entries if policy.allows(entry["id"])]
            if len(self._bodies) >= _MAX_BODIES:
                self._bodies.clear()
            body = self._bodies[policy] = orjson.dumps({"object": "list", "data": entries})
        return body

    async def refresh(self) -> bool:
        """Ask every source for its list, all at once; True when the public list changed.
        Never raises: a failed source keeps its last list."""
        if not self._listers:
            return False
        names = list(self._listers)
        results = await asyncio.gather(*(self._fetch(name) for name in names))
        for name, listed in zip(names, results, strict=True):
            if listed is not None:
                self._listed[name] = listed
        before = self._entries
        self._render()
        return self._entries != before

    async def _fetch(self, name: str) -> list[ListedModel] | None:
        try:
            async with asyncio.timeout(FETCH_TIMEOUT):
                listed = await self._listers[name].models()
        except (PrismError, TimeoutError) as error:
            reason = error.message if isinstance(error, PrismError) else "timed out"
            log.warning("model list of %r not refreshed (%s); its last kept", name, reason)
            self._metrics.model_list_fetches.labels(name, "failed").inc()
            return None
        except Exception:  # an adapter's bug must not end the refresh loop
            log.exception("model list of %r failed; its last kept", name)
            self._metrics.model_list_fetches.labels(name, "failed").inc()
            return None
        self._metrics.model_list_fetches.labels(name, "ok").inc()
        return listed

    def _render(self) -> None:
        entries = {
            name: {"id": name, "object": "model", "created": self._created, "owned_by": _OWNER}
            for name in self._named
        }
        route_of = self._config.route
        for route, targets in self._wildcards:
            for provider in targets:
                for model in self._listed.get(provider, ()):
                    if model.id in entries or route_of(model.id) is not route:
                        continue  # named, listed by an earlier target, or routed elsewhere
                    if not _exact(model.id):
                        continue
                    entries[model.id] = {
                        "id": model.id,
                        "object": "model",
                        "created": model.created,
                        "owned_by": model.owned_by or provider,
                    }
        self._entries = [entries[name] for name in sorted(entries)]
        self._bodies = {}
        self._metrics.models_listed.set(len(self._entries))
