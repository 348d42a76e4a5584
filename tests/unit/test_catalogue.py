"""The catalogue file: overrides merge into the built-in models field by field."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.core.catalogue import TEXT_BATCH_TOKENS, builtin_models, load_catalogue
from carpool.core.errors import ConfigError
from worker.handlers.torchload import weights_setting

#: What the refusal of a model without weights advises, with a path filled in.
ADVISED = '[models.resnet18.options]\nweights = "/srv/weights/resnet18.pth"\n'


def catalogue_from(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "carpool.toml"
    path.write_text(text)
    return path


def test_the_advised_weights_snippet_keeps_every_other_builtin_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        weights_setting(builtin_models()["resnet18"])
    assert "[models.resnet18.options] weights = \"/path/to/file\"" in str(refused.value)
    spec = load_catalogue(catalogue_from(tmp_path, ADVISED)).get("resnet18")
    builtin = builtin_models()["resnet18"]
    assert spec.options == {**builtin.options, "weights": "/srv/weights/resnet18.pth"}
    assert spec.bins == builtin.bins and spec.kind == builtin.kind


def test_a_scalar_override_keeps_the_other_fields_and_bins_replace_whole(
        tmp_path: Path) -> None:
    text = """
[models.synthetic]
result_ttl_s = 60
[[models.synthetic.bins]]
name = "only"
max_size = 8
max_batch = 4
max_wait_ms = 5
max_depth = 100
"""
    spec = load_catalogue(catalogue_from(tmp_path, text)).get("synthetic")
    builtin = builtin_models()["synthetic"]
    assert spec.result_ttl_s == 60 and spec.options == builtin.options
    assert [b.name for b in spec.bins] == ["only"]


def test_a_short_text_bins_batch_holds_the_text_token_budget_not_64_texts() -> None:
    # The busiest bins of a text mix are the short ones, and their jobs the cheapest:
    # a batch of 64 texts of 16 tokens would drain the busiest bin slower than it fills
    # while a backlogged worker serves 19 bins in turn.
    bins = {b.max_size: b.max_batch for b in builtin_models()["minilm"].bins}
    assert bins[16] == TEXT_BATCH_TOKENS // 16 == 128
    assert bins[24] == TEXT_BATCH_TOKENS // 24
    assert all(bins[n] == max(64, TEXT_BATCH_TOKENS // n) for n in bins if n <= 128)
    assert (bins[32], bins[128], bins[256], bins[512]) == (64, 64, 32, 16)
