"""An image classifier: any torchvision classification architecture, by name, or
EfficientNet-Lite0 (``worker.handlers.efficientnet_lite``).

``options``: ``arch`` (e.g. "resnet18", "efficientnet_lite0"), ``weights`` (see
torchload), ``labels``
("imagenet", a file of one label per line, or absent: "class_<i>"),
``num_classes`` (default: the labels' count, else 1000), ``top_k`` (5),
``resize``/``crop`` (256/224), and ``dtype``, ``channels_last``, ``compile``
(``worker.handlers.tuning``). Inputs arrive as the web stores them:
``{"image_b64", "format", "width", "height"}``. Items are uint8 pixels: they
cross to the device at a quarter of float32's bytes, and the device converts
and normalises them, with the statistics the architecture was trained with.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torchvision

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import ConfigError
from carpool.core.settings import Settings
from worker.handlers import efficientnet_lite
from worker.handlers.imaging import ImageGeometry, decode, image_bytes
from worker.handlers.torchload import load_module
from worker.handlers.tuning import HandlerContext

#: ImageNet's channel statistics, which torchvision's classifiers were trained with.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_TOP_K = 5


def normalisation(arch: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel, on 0..1 pixels, that ``arch``'s weights expect."""
    if arch == efficientnet_lite.ARCH:
        return efficientnet_lite.MEAN, efficientnet_lite.STD
    return IMAGENET_MEAN, IMAGENET_STD


def imagenet_labels(arch: str) -> list[str]:
    """ImageNet's 1000 class names, from torchvision's weights metadata (offline)."""
    try:
        weights = torchvision.models.get_model_weights(arch)
    except ValueError:
        weights = torchvision.models.ResNet18_Weights
    return list(next(iter(weights)).meta["categories"])


def labels_for(spec: ModelSpec) -> list[str] | None:
    labels = spec.options.get("labels")
    if labels is None:
        return None
    if labels == "imagenet":
        return imagenet_labels(str(spec.options.get("arch", "")))
    path = Path(str(labels))
    if not path.is_file():
        raise ConfigError(f"model {spec.name!r}: labels file {path} does not exist")
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


class ImageHandler:
    def __init__(self, spec: ModelSpec, device: str) -> None:
        self.spec = spec
        self.context = HandlerContext.of(spec, device)
        self.device = self.context.device
        self.geometry = ImageGeometry.from_options(spec.options)
        self.top_k = int(spec.options.get("top_k", DEFAULT_TOP_K))
        self.labels: list[str] = []
        self.model: torch.nn.Module | None = None
        mean, std = normalisation(str(spec.options.get("arch", "")))
        self._mean = torch.tensor(mean).view(1, 3, 1, 1)
        self._std = torch.tensor(std).view(1, 3, 1, 1)

    def _build(self, num_classes: int) -> torch.nn.Module:
        arch = self.spec.options.get("arch")
        if arch == efficientnet_lite.ARCH:
            return efficientnet_lite.build(self.spec.name, num_classes, self.geometry.crop)
        if arch not in torchvision.models.list_models(module=torchvision.models):
            raise ConfigError(f"model {self.spec.name!r}: options.arch {arch!r} is not a "
                              "torchvision classification architecture, nor "
                              f"{efficientnet_lite.ARCH!r}")
        model: torch.nn.Module = torchvision.models.get_model(
            str(arch), weights=None, num_classes=num_classes)
        return model

    def load(self) -> None:
        labels = labels_for(self.spec)
        num_classes = len(labels) if labels else int(self.spec.options.get("num_classes", 1000))
        self.labels = labels or [f"class_{i}" for i in range(num_classes)]
        self.model = self.context.prepare(load_module(self.spec,
                                                      lambda: self._build(num_classes)))
        self._mean = self._mean.to(self.device)
        self._std = self._std.to(self.device)

    def preprocess(self, job_input: Any) -> torch.Tensor:
        pixels = decode(image_bytes(job_input), self.geometry)
        return torch.from_numpy(pixels).permute(2, 0, 1)  # HWC -> CHW, still uint8

    def example(self, bin_spec: BinSpec) -> torch.Tensor:
        """An item of the bin's shape, for warm-up and calibration."""
        return torch.zeros(3, self.geometry.crop, self.geometry.crop, dtype=torch.uint8)

    def collate(self, items: Sequence[torch.Tensor], bin_spec: BinSpec) -> torch.Tensor:
        # Every bin resizes to one shape, so the bin's shape is the crop.
        return torch.stack(list(items))

    def forward(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.model is not None, "load() first"
        x = self.context.inputs((batch.float().div_(255.0) - self._mean) / self._std)
        with self.context.autocast():
            logits = self.model(x)
        probs = torch.softmax(logits.float(), dim=1)
        scores, indices = probs.topk(min(self.top_k, probs.shape[1]), dim=1)
        return scores, indices

    def postprocess(self, output: tuple[torch.Tensor, torch.Tensor], n: int) -> list[Any]:
        scores, indices = (t.tolist() for t in output)
        return [
            {"top_k": [{"label": self.labels[i], "index": i, "score": round(s, 6)}
                       for s, i in zip(row_s, row_i, strict=True)]}
            for row_s, row_i in zip(scores, indices, strict=True)
        ]


def handler_for(spec: ModelSpec, settings: Settings) -> ImageHandler:
    """The handler for a ``kind = "image"`` model (carpool/core/kinds.py)."""
    from worker.handlers import resolve_device

    return ImageHandler(spec, resolve_device(settings.executor.device))
