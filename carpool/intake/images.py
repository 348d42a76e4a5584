"""A header-only image probe: format and size, without decoding a single pixel.

The web tier must refuse a bad or oversized image before it is queued, and it
must do so cheaply: Pillow's ``Image.open`` reads only the header, and
``verify`` walks a PNG's chunk checksums without inflating them.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from carpool.core.catalogue import ModelSpec
from carpool.core.errors import InputTooLarge, InvalidInput
from carpool.core.model_options import int_option

#: What the image handlers decode; anything else is refused at the door.
ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP")
#: Per-model defaults for ``options.max_side`` and ``options.max_pixels``.
DEFAULT_MAX_SIDE = 8192
DEFAULT_MAX_PIXELS = 40_000_000
#: Longer side over shorter side; beyond this an image is a strip, not a picture.
MAX_ASPECT_RATIO = 20


@dataclass(frozen=True)
class ImageInfo:
    format: str
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


@dataclass(frozen=True)
class ImageLimits:
    max_side: int = DEFAULT_MAX_SIDE
    max_pixels: int = DEFAULT_MAX_PIXELS

    @classmethod
    def of(cls, spec: ModelSpec) -> ImageLimits:
        return cls(max_side=int_option(spec, "max_side", DEFAULT_MAX_SIDE),
                   max_pixels=int_option(spec, "max_pixels", DEFAULT_MAX_PIXELS))


def _open(data: bytes) -> ImageInfo:
    # catch_warnings swaps the process-wide filter list. Under gevent nothing
    # switches inside this block (no I/O on a BytesIO); under real threads a
    # race can only leave this same "error" filter installed, which is harmless.
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as im:
            info = ImageInfo(str(im.format), im.width, im.height)
            im.verify()  # PNG: checks every chunk's CRC, so a cut-off file shows here
    return info


def probe(data: bytes, limits: ImageLimits) -> ImageInfo:
    """Format and size of ``data``; raises InvalidInput or InputTooLarge with the reason."""
    try:
        info = _open(data)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputTooLarge(
            f"image claims more than {Image.MAX_IMAGE_PIXELS} pixels "
            "(refused as a possible decompression bomb)"
        ) from None
    except UnidentifiedImageError:
        raise InvalidInput(
            f"not an image in an accepted format ({', '.join(ALLOWED_FORMATS)}), "
            "or its header is damaged"
        ) from None
    except Exception as exc:  # noqa: BLE001
        # Pillow's parsers raise a zoo of types on malformed input (OSError,
        # SyntaxError, struct.error, EOFError, ValueError...): all mean "broken file".
        raise InvalidInput(f"image is truncated or corrupt: {exc}") from None
    _check(info, limits)
    return info


def _check(info: ImageInfo, limits: ImageLimits) -> None:
    size = f"{info.width}x{info.height}"
    if info.width < 1 or info.height < 1:
        raise InvalidInput(f"image has no pixels ({size})")
    if max(info.width, info.height) > limits.max_side:
        raise InputTooLarge(f"image is {size}; each side must be at most {limits.max_side}")
    if info.pixels > limits.max_pixels:
        raise InputTooLarge(
            f"image is {size} = {info.pixels} pixels; at most {limits.max_pixels} allowed"
        )
    if max(info.width, info.height) > MAX_ASPECT_RATIO * min(info.width, info.height):
        raise InvalidInput(f"image is {size}; aspect ratio must be at most {MAX_ASPECT_RATIO}:1")
