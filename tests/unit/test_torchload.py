"""`weights = "torchvision"`: torchvision's DEFAULT weights from the TORCH_HOME cache,
offline: the test seeds the cache with a state dict it makes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision

from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ConfigError
from tests.support.images import image_file, stored
from tests.unit.test_handlers_image import BIN, SMALL, loaded, reference_probs, run


def seeded_cache(torch_home: Path) -> torch.nn.Module:
    """A resnet18 saved where torchvision looks for its DEFAULT ImageNet weights."""
    torch.manual_seed(1)
    model = torchvision.models.resnet18().eval()
    url = torchvision.models.ResNet18_Weights.DEFAULT.url
    checkpoints = torch_home / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save(model.state_dict(), checkpoints / Path(url).name)
    return model


def resnet18(weights: str) -> ModelSpec:
    return ModelSpec("resnet18", "image", "pixels", (BIN,), options={
        **SMALL, "arch": "resnet18", "labels": "imagenet", "top_k": 3, "weights": weights})


def test_torchvision_weights_load_from_the_torch_home_cache_with_imagenet_labels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    reference = seeded_cache(tmp_path)
    handler = loaded(resnet18("torchvision"))
    data = image_file(64, 48)
    (result,) = run(handler, [stored(data)])
    expected = torch.topk(reference_probs(reference, data), 3)
    categories = torchvision.models.ResNet18_Weights.DEFAULT.meta["categories"]
    assert [t["index"] for t in result["top_k"]] == expected.indices.tolist()
    assert [t["label"] for t in result["top_k"]] == [categories[i]
                                                     for i in expected.indices.tolist()]


def test_torchvision_weights_for_an_arch_without_them_are_refused_by_name() -> None:
    spec = resnet18("torchvision")
    spec = ModelSpec(spec.name, spec.kind, spec.measure, spec.bins,
                     options={**spec.options, "arch": "no_such_net"})
    with pytest.raises(ConfigError, match="no_such_net"):
        loaded(spec)
