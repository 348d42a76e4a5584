"""Small images made on the spot, as the web would store them."""

from __future__ import annotations

import base64
import io
from typing import Any

from PIL import Image


def image_file(width: int, height: int, fmt: str = "JPEG", seed: int = 0) -> bytes:
    """A colourful ``width x height`` image in ``fmt``; ``seed`` changes its colours."""
    im = Image.new("RGB", (width, height))
    im.putdata([((x * 7 + seed * 50) % 256, (y * 5 + seed * 30) % 256, (x + y + seed) % 256)
                for y in range(height) for x in range(width)])
    out = io.BytesIO()
    im.save(out, format=fmt)
    return out.getvalue()


def stored(data: bytes) -> dict[str, Any]:
    """The input JSON the web stores for an image file."""
    with Image.open(io.BytesIO(data)) as im:
        fmt, width, height = im.format, im.width, im.height
    return {"image_b64": base64.b64encode(data).decode("ascii"), "format": fmt,
            "width": width, "height": height}
