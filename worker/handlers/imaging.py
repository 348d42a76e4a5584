"""Decode and resize one image for a classifier, with Pillow's GIL-free paths.

Pillow releases the GIL while it decodes and resamples, so a few threads
decode in parallel with each other and with the forward pass; a process pool
measured slower here (docs/benchmarks.md, "Real models"), because each image's
bytes and pixels then cross a pipe. Two shortcuts keep large images cheap:

- ``Image.draft`` makes the JPEG decoder scale by 1/2, 1/4 or 1/8 in the DCT, so
  a 4000 x 3000 photo is decoded at no more than the size the resize needs;
- ``reducing_gap`` lets ``resize`` first shrink by a whole factor with a box
  filter (``Image.reduce``), then resample only the remainder.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from carpool.core.errors import InputTooLarge, InvalidInput

#: What the web lets in; the worker refuses anything else again.
FORMATS = ("JPEG", "PNG", "WEBP")
#: resize(..., reducing_gap=2.0): reduce() first while the image is > 2x the target.
REDUCING_GAP = 2.0


@dataclass(frozen=True)
class ImageGeometry:
    """Resize the shorter side to ``resize``, then cut the centre ``crop`` square."""

    resize: int = 256
    crop: int = 224
    max_pixels: int = 40_000_000

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ImageGeometry:
        return cls(int(options.get("resize", 256)), int(options.get("crop", 224)),
                   int(options.get("max_pixels", 40_000_000)))


def image_bytes(job_input: Any) -> bytes:
    """The file inside an input as the web stores it: ``{"image_b64", ...}``."""
    if not isinstance(job_input, dict) or not isinstance(job_input.get("image_b64"), str):
        raise InvalidInput("image input must be {'image_b64': str, ...}")
    try:
        return base64.b64decode(job_input["image_b64"], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("image_b64 is not valid base64") from None


def _scaled(width: int, height: int, shorter: int) -> tuple[int, int]:
    if width <= height:
        return shorter, max(1, round(height * shorter / width))
    return max(1, round(width * shorter / height)), shorter


def decode(data: bytes, geometry: ImageGeometry) -> npt.NDArray[np.uint8]:
    """``crop x crop x 3`` RGB pixels of the centre of the resized image."""
    with Image.open(io.BytesIO(data), formats=FORMATS) as im:
        if im.width * im.height > geometry.max_pixels:
            raise InputTooLarge(f"image is {im.width}x{im.height}; at most "
                                f"{geometry.max_pixels} pixels")
        target = _scaled(im.width, im.height, geometry.resize)
        if im.format == "JPEG":
            im.draft("RGB", target)  # decode at 1/2, 1/4 or 1/8 scale when that suffices
        rgb = im.convert("RGB")
    if rgb.size != target:
        rgb = rgb.resize(target, Image.Resampling.BILINEAR, reducing_gap=REDUCING_GAP)
    left = (target[0] - geometry.crop) // 2
    top = (target[1] - geometry.crop) // 2
    if left < 0 or top < 0:
        raise InvalidInput(f"resize {geometry.resize} is smaller than crop {geometry.crop}")
    box = (left, top, left + geometry.crop, top + geometry.crop)
    return np.array(rgb.crop(box), dtype=np.uint8)  # a writable copy: torch wants one
