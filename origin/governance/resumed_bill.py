"""The bill of a resumed answer (``origin.routing.resume``): each provider pays for its own
part, at its own price.

- The broken part: the prompt its provider read and the tokens it produced before the
  break. Its prompt is what that part reported (chat's usage chunk, Messages'
  ``message_start``), else the continuation's prompt less the relayed text it was given
  back; its completion is what it reported, else the relayed text's tokens, estimated
  (``estimated_tokens``: no provider counted them).
- The continuation: the usage it reported itself, which counts the relayed text it was
  given in its prompt.

The answer's usage as the client sees it (and as usage records it) stays the spliced
answer's own; only the cost is the sum of the parts' costs.
"""

from __future__ import annotations

from typing import NamedTuple

from ..providers.token_counts import Tokens

__all__ = ["BillPart", "Resumption", "broken_part_tokens"]


class Resumption(NamedTuple):
    """What a resumed answer's bill needs of its two parts."""

    provider: str  # that broke
    upstream: str  # its upstream model
    usage: Tokens | None  # what the broken part reported, if anything
    text_tokens: int  # the relayed text's, estimated
    continuation: Tokens | None  # what the continuation reported of its own


class BillPart(NamedTuple):
    """One provider's part of an answer, as billed (``Charge.parts``)."""

    provider: str
    upstream: str
    tokens: Tokens | None  # None: unknown
    cost: int | None  # micro-USD; None: no tokens or no price


def broken_part_tokens(resumption: Resumption) -> Tokens | None:
    """The broken part's tokens; None when its prompt is unknown (neither part reported a
    usage)."""
    reported, continuation = resumption.usage, resumption.continuation
    completion = (reported.completion if reported else 0) or resumption.text_tokens
    if reported is not None and reported.prompt:
        return reported._replace(completion=completion)
    if continuation is None:
        return None
    # The continuation's prompt holds the relayed text as its last turn: the broken
    # part's provider read the prompt only.
    prompt = max(0, continuation.prompt - resumption.text_tokens)
    return Tokens(prompt, 0, 0, completion)
