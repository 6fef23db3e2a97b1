"""Which requests may be answered semantically, and the partition each one is compared in.

Partition first, then similarity: a request is compared only with entries whose
request was identical in everything but the text of its last user message. The
partition key is SHA-256 over the fingerprint's own canonical document (project,
path, model, every body field the fingerprint covers: system prompt, earlier turns,
tools, tool choice, response format, temperature...) with that one text removed. So
another project, model, system prompt or temperature is another partition, never a
lower score.

Only a question qualifies (``question``):

- the last message is the user's, and all of it is text;
- at most ``MAX_EARLIER_TURNS`` user/assistant turns before it (system and developer
  messages aside): a long conversation's partition is all but unique, so embedding it
  would cost a model call for a hit that never comes;
- no tool calls or tool results, no images, audio or files anywhere;
- ``n`` is 1 and ``temperature`` is at most ``MAX_TEMPERATURE`` (unset counts as 1,
  the providers' default): a caller asking for more randomness than the default wants
  a fresh sample, not a neighbour's answer;
- the text is at most ``MAX_TEXT_CHARS`` (long prompts are documents, not questions)
  and has at least one word or number (two texts of only punctuation, emoji or spaces
  would all embed alike).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, NamedTuple

from prism import ChatRequest, canonical_document

from .guard import words

__all__ = [
    "MAX_EARLIER_TURNS",
    "MAX_TEMPERATURE",
    "MAX_TEXT_CHARS",
    "Question",
    "normalized",
    "question",
]

MAX_EARLIER_TURNS = 2
MAX_TEMPERATURE = 1.0
MAX_TEXT_CHARS = 1000
PARTITION_VERSION = 1

_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)
_CONTEXT_ROLES = frozenset({"system", "developer"})
_TURN_ROLES = frozenset({"user", "assistant"})
_TURN_FIELDS = frozenset({"role", "content", "name"})  # anything else (tool_calls, audio...)


_CONTRACTIONS = {
    "what's": "what is",
    "who's": "who is",
    "where's": "where is",
    "how's": "how is",
    "it's": "it is",
    "that's": "that is",
    "there's": "there is",
    "let's": "let us",
    "i'm": "i am",
    "you're": "you are",
    "isn't": "is not",
    "aren't": "are not",
    "wasn't": "was not",
    "weren't": "were not",
    "don't": "do not",
    "doesn't": "does not",
    "didn't": "did not",
    "can't": "cannot",
    "won't": "will not",
    "couldn't": "could not",
    "shouldn't": "should not",
    "wouldn't": "would not",
    "haven't": "have not",
    "hasn't": "has not",
}
_CONTRACTION = re.compile(r"[a-z]+'[a-z]+")
_SPACES = re.compile(r"\s+")
_END = re.compile(r"[?.!\s]+$")


def normalized(text: str) -> str:
    """The text as it is embedded: lower case (the model is uncased anyway), common
    contractions spelled out, whitespace collapsed, closing ``?``/``.``/``!`` dropped; so
    "What's the capital of France?" and "what is the capital of france" are one vector."""
    text = text.lower().replace("\u2019", "'")
    text = _CONTRACTION.sub(lambda m: _CONTRACTIONS.get(m.group(0), m.group(0)), text)
    return _END.sub("", _SPACES.sub(" ", text).strip())


class Question(NamedTuple):
    partition: str  # 64 hex chars
    text: str  # the last user message's text: what is embedded and compared


def _text(content: Any) -> str | None:
    """The content's text when it is all text (a string, or only text parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        return None
    parts: list[str] = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or set(part) - {"type", "text"}:
            return None
        text = part.get("text")
        if not isinstance(text, str):
            return None
        parts.append(text)
    return "\n".join(parts)


def question(project: str, path: str, chat: ChatRequest) -> Question | None:
    """The request's partition and text, or None when it does not qualify."""
    body = chat.body
    if chat.n != 1:
        return None
    temperature = body.get("temperature")
    if temperature is not None and temperature > MAX_TEMPERATURE:
        return None
    messages = body["messages"]
    last = messages[-1]
    if last.get("role") != "user" or set(last) - _TURN_FIELDS:
        return None
    text = _text(last.get("content"))
    if text is None or len(text) > MAX_TEXT_CHARS or not words(text):
        return None  # no word at all ("???", "..."): nothing a paraphrase could share
    turns = 0
    for message in messages[:-1]:
        role = message.get("role")
        if role in _CONTEXT_ROLES:
            if _text(message.get("content")) is None:
                return None
        elif role in _TURN_ROLES:
            turns += 1
            if turns > MAX_EARLIER_TURNS or set(message) - _TURN_FIELDS:
                return None
            if _text(message.get("content")) is None:
                return None
        else:  # tool or function results
            return None
    document = canonical_document(project, path, chat)
    request = dict(document["request"])
    request["messages"] = [*messages[:-1], {**last, "content": None}]
    document["request"] = request
    document["semantic"] = PARTITION_VERSION
    partition = hashlib.sha256(_CANONICAL.encode(document).encode()).hexdigest()
    return Question(partition, text)
