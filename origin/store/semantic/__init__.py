"""The semantic cache: a paraphrase of a cached question answered from its entry.

Opt-in per project (the policy's ``cache.semantic``), partitioned hard (``partition``),
embedded on the origin's CPU (``model``, ``embedder``), indexed in Redis (``index``),
and guarded against near misses a score cannot see (``guard``). ``cache`` ties them
together for the chat route.
"""

from __future__ import annotations

from .cache import Match, Pending, SemanticCache, build_semantic_cache
from .partition import Question, question

__all__ = ["Match", "Pending", "Question", "SemanticCache", "build_semantic_cache", "question"]
