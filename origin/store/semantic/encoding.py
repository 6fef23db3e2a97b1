"""Texts to vectors with a loaded model: the one step the embedder's thread (numpy or
onnxruntime in the origin's process) and the model's own process
(``embed_process``) both take, so a text is refused, grouped and embedded the same way."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from .engine import EncodingModel

if TYPE_CHECKING:
    from .model import Vector

__all__ = ["encode_texts"]

# Texts are run in groups of like lengths: every text in a group is padded to its longest,
# and padding costs as much as a token. A group takes texts up to this many tokens longer
# than its shortest.
_LENGTH_SLACK = 4


def encode_texts(model: EncodingModel, texts: list[str]) -> list[Vector | None]:
    """Each text's unit-length vector, None for one that cannot be compared (too long, or
    characters the model cannot see: ``tokens.Incomparable``)."""
    from .tokens import Incomparable

    out: list[Vector | None] = [None] * len(texts)
    fitting: list[tuple[int, list[int]]] = []
    for row, text in enumerate(texts):
        with contextlib.suppress(Incomparable):
            fitting.append((row, model.tokens(text)))
    fitting.sort(key=lambda item: len(item[1]))
    while fitting:
        shortest = len(fitting[0][1])
        end = 1
        while end < len(fitting) and len(fitting[end][1]) <= shortest + _LENGTH_SLACK:
            end += 1
        group, fitting = fitting[:end], fitting[end:]
        vectors = model.encode_ids([ids for _, ids in group])
        for (row, _), vector in zip(group, vectors, strict=True):
            out[row] = vector
    return out
