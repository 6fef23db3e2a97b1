"""Common secrets taken out of text before a request's body is put in its record.

What is recognised, anywhere in a string (no word boundary is needed: a secret glued to
other text is still found): API keys of the ``sk-`` form (OpenAI's, Anthropic's
``sk-ant-``, Prism's own ``sk-prism-v1.…``), AWS access key ids (``AKIA…``, ``ASIA…``),
bearer tokens (``Bearer`` and 16 or more token characters), JSON Web Tokens
(``eyJ….eyJ….…``) and, when the project asks (``prism policy set --redact-emails``),
email addresses. Each is replaced whole by
``[REDACTED]``; a match runs as long as the secret's characters go on, so no part of one
is left behind. Only ASCII classes are used: what Unicode calls a letter never extends or
hides a match.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["REDACTED", "Redactor"]

REDACTED = "[REDACTED]"

_SECRETS = (
    r"sk-[A-Za-z0-9_.\-]{16,}",  # OpenAI, Anthropic (sk-ant-...), Prism (sk-prism-v1....)
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[A-Z0-9]{16}",  # AWS access key ids
    r"[Bb][Ee][Aa][Rr][Ee][Rr][ \t]+[A-Za-z0-9\-._~+/]{16,}=*",  # RFC 6750 bearer tokens
    r"eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*",  # JWTs (a JSON header: eyJ)
)
_EMAIL = r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}"

_PLAIN = re.compile("|".join(_SECRETS))
_WITH_EMAILS = re.compile("|".join((*_SECRETS, _EMAIL)))


class Redactor:
    """Replaces the secrets it knows (and emails, if asked) in text and in JSON values."""

    __slots__ = ("_pattern",)

    def __init__(self, emails: bool = False) -> None:
        self._pattern = _WITH_EMAILS if emails else _PLAIN

    def text(self, value: str) -> str:
        return self._pattern.sub(REDACTED, value)

    def json(self, value: Any) -> Any:
        """A JSON value with every string in it (keys too) redacted; other values as they are."""
        if isinstance(value, str):
            return self._pattern.sub(REDACTED, value)
        if isinstance(value, dict):
            return {self.text(str(k)): self.json(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.json(item) for item in value]
        return value
