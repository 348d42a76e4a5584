"""Token counts for text models, the same in the web (to pick a bin) and the worker
(to pad to it): one WordPiece tokenizer built from a vocabulary file by the
``tokenizers`` package (Rust, no torch), so the torch-free web image counts
exactly what the worker computes.

A text model's ``options`` name its tokenizer:

- ``vocab``: a bundled vocabulary (``"all-MiniLM-L6-v2"``, the default) or a
  path to a ``vocab.txt``;
- ``lowercase``: BERT-uncased normalisation (default true);
- ``max_tokens``: the model's limit, ``[CLS]`` and ``[SEP]`` included (default
  512, BERT's position embeddings); longer inputs are truncated to it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from importlib.resources import as_file, files
from pathlib import Path
from typing import TYPE_CHECKING

from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ConfigError
from carpool.core.model_options import int_option

if TYPE_CHECKING:
    from tokenizers import Tokenizer

#: Vocabularies shipped inside the package (see carpool/core/vocab/NOTICE).
BUNDLED_VOCABS = ("all-MiniLM-L6-v2",)
DEFAULT_VOCAB = "all-MiniLM-L6-v2"
#: BERT's position embeddings stop at 512.
DEFAULT_MAX_TOKENS = 512
#: [CLS] and [SEP]: the shortest encoding of any text.
SPECIAL_TOKENS = 2


@dataclass(frozen=True)
class Encoded:
    """Token ids of one text, ``[CLS] ... [SEP]``, cut to the model's limit."""

    ids: list[int]
    truncated: bool


@dataclass(frozen=True)
class TokenizerConfig:
    vocab: str
    lowercase: bool
    max_tokens: int

    @classmethod
    def of(cls, spec: ModelSpec) -> TokenizerConfig:
        opts = spec.options
        max_tokens = int_option(spec, "max_tokens", DEFAULT_MAX_TOKENS)
        if max_tokens <= SPECIAL_TOKENS:
            raise ConfigError(f"model {spec.name!r}: max_tokens must exceed {SPECIAL_TOKENS}")
        return cls(str(opts.get("vocab", DEFAULT_VOCAB)), bool(opts.get("lowercase", True)),
                   max_tokens)


class WordPiece:
    """A BERT WordPiece tokenizer with truncation at ``max_tokens``; thread-safe."""

    def __init__(self, config: TokenizerConfig) -> None:
        self.config = config
        self._tokenizer = _build(config)

    def encode(self, text: str) -> Encoded:
        enc = self._tokenizer.encode(text)
        return Encoded(list(enc.ids), truncated=bool(enc.overflowing))

    @property
    def vocab_size(self) -> int:
        """Entries in the vocabulary: a model's embedding table must have as many."""
        return int(self._tokenizer.get_vocab_size())

    def count(self, text: str) -> int:
        """Tokens the model computes for ``text``: after truncation, specials included."""
        return len(self._tokenizer.encode(text).ids)


def _wordpiece(vocab_file: str, lowercase: bool) -> Tokenizer:
    # Imported here so that importing carpool never needs the tokenizers wheel.
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = models.WordPiece.read_file(vocab_file)
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    # BERT-uncased: clean control characters, split CJK, lowercase and strip accents.
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]),
                                                 ("[SEP]", vocab["[SEP]"])])
    return tokenizer


def _build(config: TokenizerConfig) -> Tokenizer:
    if config.vocab in BUNDLED_VOCABS:
        # as_file: a real path while the block lasts, even from a zipped install.
        with as_file(files("carpool.core").joinpath("vocab", f"{config.vocab}.txt")) as path:
            tokenizer = _wordpiece(str(path), config.lowercase)
    elif Path(config.vocab).is_file():
        tokenizer = _wordpiece(config.vocab, config.lowercase)
    else:
        raise ConfigError(
            f"tokenizer vocabulary {config.vocab!r} is neither bundled "
            f"({', '.join(BUNDLED_VOCABS)}) nor a readable file")
    tokenizer.enable_truncation(config.max_tokens)
    tokenizer.no_padding()
    return tokenizer


_cache: dict[TokenizerConfig, WordPiece] = {}
_cache_lock = threading.Lock()


def tokenizer_for(spec: ModelSpec) -> WordPiece:
    """The (shared, cached) tokenizer of a text model."""
    config = TokenizerConfig.of(spec)
    with _cache_lock:
        if config not in _cache:
            _cache[config] = WordPiece(config)
        return _cache[config]


def count_tokens(spec: ModelSpec, text: str) -> int:
    """The web's ``tokens`` measure: what the worker will pad into a bin."""
    return tokenizer_for(spec).count(text)
