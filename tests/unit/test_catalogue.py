"""The catalogue file: overrides merge into the built-in models field by field."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.core.catalogue import builtin_models, load_catalogue
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
