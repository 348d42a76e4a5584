"""The image classifier on the CPU, with weights the tests make: a state dict,
a TorchScript archive and a torch.export program."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import ConfigError, InvalidInput
from tests.support.images import image_file, stored
from worker.handlers.image import ImageHandler
from worker.handlers.imaging import ImageGeometry, decode, image_bytes

torch.set_num_threads(1)
BIN = BinSpec("fast", max_size=512 * 512, max_batch=8, max_wait_ms=5, max_depth=64)
#: Tiny crops keep resnet18 fast on a shared CPU; the code path is the same as 224.
SMALL = {"resize": 40, "crop": 32}


def spec(**options: Any) -> ModelSpec:
    return ModelSpec("img", "image", "pixels", (BIN,), options={**SMALL, **options})


@pytest.fixture(scope="module")
def resnet_state(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    path = tmp_path_factory.mktemp("w") / "resnet18-10.pth"
    torch.save(model.state_dict(), path)
    return path, model


def loaded(s: ModelSpec) -> ImageHandler:
    handler = ImageHandler(s, "cpu")
    handler.load()
    return handler


def run(handler: ImageHandler, inputs: list[dict[str, Any]]) -> list[Any]:
    items = [handler.preprocess(x) for x in inputs]
    with torch.inference_mode():
        out = handler.forward(handler.collate(items, BIN))
    return handler.postprocess(out, len(items))


def reference_probs(model: torch.nn.Module, data: bytes) -> torch.Tensor:
    pixels = torch.from_numpy(decode(data, ImageGeometry(40, 32))).permute(2, 0, 1).float()
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    with torch.inference_mode():
        return torch.softmax(model(((pixels / 255 - mean) / std)[None]), dim=1)[0]


def test_a_state_dict_model_gives_the_top_k_of_the_same_architecture_run_directly(
        resnet_state: tuple[Path, torch.nn.Module]) -> None:
    path, model = resnet_state
    handler = loaded(spec(arch="resnet18", weights=str(path), num_classes=10, top_k=3))
    files = [image_file(64, 48, "JPEG", seed=1), image_file(50, 70, "PNG", seed=2)]
    results = run(handler, [stored(f) for f in files])
    assert len(results) == 2
    for data, result in zip(files, results, strict=True):
        probs = reference_probs(model, data)
        top = probs.topk(3)
        assert [r["index"] for r in result["top_k"]] == top.indices.tolist()
        assert [r["score"] for r in result["top_k"]] == pytest.approx(top.values.tolist(),
                                                                      abs=1e-4)
        assert result["top_k"][0]["label"] == f"class_{top.indices[0].item()}"


def test_imagenet_labels_come_from_torchvision_metadata_offline(tmp_path: Path) -> None:
    model = torchvision.models.resnet18(num_classes=1000)
    path = tmp_path / "r.pth"
    torch.save(model.state_dict(), path)
    handler = loaded(spec(arch="resnet18", weights=str(path), labels="imagenet"))
    assert len(handler.labels) == 1000 and handler.labels[0] == "tench"
    result = run(handler, [stored(image_file(40, 40))])[0]
    assert len(result["top_k"]) == 5
    assert all(r["label"] == handler.labels[r["index"]] for r in result["top_k"])


class Tiny(torch.nn.Module):
    """A two-layer classifier whose scripted and exported forms the tests load."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean(dim=(2, 3)))


def test_a_torchscript_archive_loads_without_naming_an_architecture(tmp_path: Path) -> None:
    torch.manual_seed(1)
    path = tmp_path / "tiny.pt"
    with warnings.catch_warnings():  # torch 2.14 deprecates TorchScript; users still have it
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(Tiny().eval()), str(path))
    handler = loaded(spec(weights=str(path), num_classes=3, top_k=3))
    results = run(handler, [stored(image_file(33, 33, seed=s)) for s in range(3)])
    assert [len(r["top_k"]) for r in results] == [3, 3, 3]
    assert all(sum(r["score"] for r in res["top_k"]) == pytest.approx(1, abs=1e-4)
               for res in results for r in [res])


def test_a_torch_export_program_loads_with_a_dynamic_batch(tmp_path: Path) -> None:
    torch.manual_seed(2)
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(Tiny().eval(), (torch.zeros(2, 3, 32, 32),),
                                  dynamic_shapes=({0: batch},))
    path = tmp_path / "tiny.pt2"
    torch.export.save(program, path)
    handler = loaded(spec(weights=str(path), num_classes=3, top_k=2))
    results = run(handler, [stored(image_file(40, 30, seed=s)) for s in range(3)])
    assert [len(r["top_k"]) for r in results] == [2, 2, 2]


def test_a_model_without_weights_fails_at_load_and_says_how_to_configure_them() -> None:
    with pytest.raises(ConfigError, match='weights = "random" for benchmarks'):
        loaded(spec(arch="resnet18"))


def test_random_weights_load_only_when_asked_for_by_name() -> None:
    handler = loaded(spec(arch="resnet18", weights="random", num_classes=4))
    assert len(run(handler, [stored(image_file(40, 40))])) == 1


def test_an_unknown_architecture_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'resnet9000' is not a torchvision"):
        loaded(spec(arch="resnet9000", weights="random"))


def test_a_large_jpeg_is_decoded_at_reduced_scale_and_cropped_to_shape() -> None:
    pixels = decode(image_file(1200, 900, "JPEG"), ImageGeometry(resize=64, crop=56))
    assert pixels.shape == (56, 56, 3) and pixels.dtype.name == "uint8"


def test_a_broken_image_is_an_input_error() -> None:
    data = image_file(40, 40, "PNG")
    with pytest.raises(Exception, match="truncated|broken|cannot|image"):
        decode(data[: len(data) // 2], ImageGeometry(40, 32))
    with pytest.raises(InvalidInput):
        image_bytes({"image_b64": "%%%"})
