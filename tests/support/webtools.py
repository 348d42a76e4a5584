"""Helpers for the web tests: settings with a test catalogue, an app on real Redis, images."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flask.testing import FlaskClient
from PIL import Image

from carpool.core.settings import Settings, load_settings
from tests.conftest import make_env
from web import create_app
from web.common.state import EXTENSION, WebState

#: Models beside the built-in synthetic one: a tiny bin to fill, an image and a text model.
CATALOGUE_TOML = """
[models.tiny]
kind = "synthetic"
measure = "size"
default_deadline_ms = 4000
max_deadline_ms = 60000
[[models.tiny.bins]]
name = "only"
max_size = 10
max_batch = 1
max_wait_ms = 2500
max_depth = 2

[models.imgs]
kind = "image"
measure = "pixels"
max_input_bytes = 1048576
[models.imgs.options]
max_side = 4096
max_pixels = 4000000
[[models.imgs.bins]]
name = "fast"
max_size = 65536
max_batch = 8
max_wait_ms = 20
max_depth = 100
[[models.imgs.bins]]
name = "slow"
max_size = 4000000
max_batch = 2
max_wait_ms = 50
max_depth = 100

[models.texts]
kind = "text"
measure = "tokens"
[models.texts.options]
max_chars = 1000
[[models.texts.bins]]
name = "short"
max_size = 16
max_batch = 8
max_wait_ms = 20
max_depth = 100
[[models.texts.bins]]
name = "long"
max_size = 512
max_batch = 4
max_wait_ms = 20
max_depth = 100
"""

#: At least every model's max_input_bytes (imgs: 1 MiB; the built-in resnet18: 8 MiB),
#: as the settings require.
MAX_BODY_BYTES = 8 << 20


def web_settings(redis_url: str, key_prefix: str, tmp_path: Path, **extra: str) -> Settings:
    """Settings for one test: its own key prefix, the test catalogue, an 8 MiB body bound."""
    config = tmp_path / "catalogue.toml"
    config.write_text(CATALOGUE_TOML)
    env = make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(config),
                   CARPOOL_MAX_BODY_BYTES=str(MAX_BODY_BYTES), **extra)
    return load_settings(env)


@contextmanager
def web_client(settings: Settings, *, lean_routes: bool = True) -> Iterator[FlaskClient]:
    """A Flask test client of a fresh app; its listener and connections close afterwards."""
    app = create_app(settings, lean_routes=lean_routes)
    state = app.extensions[EXTENSION]
    assert isinstance(state, WebState)
    try:
        yield app.test_client()
    finally:
        state.close()


def app_state(client: FlaskClient) -> WebState:
    state = client.application.extensions[EXTENSION]
    assert isinstance(state, WebState)
    return state


def png(width: int, height: int) -> bytes:
    """A real PNG made by Pillow."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (30, 30, 200)).save(out, format="JPEG")
    return out.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_claiming(width: int, height: int) -> bytes:
    """A well-formed PNG that claims any size; its pixel data is empty (never decoded)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr)
            + _chunk(b"IDAT", zlib.compress(b"")) + _chunk(b"IEND", b""))
