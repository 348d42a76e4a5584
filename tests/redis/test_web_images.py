"""Image submissions: raw body, multipart, base64 JSON; probed from the header only."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient
from PIL import Image

from carpool.backend import records
from carpool.backend.keys import Keys
from carpool.core.errors import InputTooLarge, InvalidInput
from carpool.intake.images import ImageLimits, probe
from tests.support.webtools import jpeg, png, png_claiming, web_client, web_settings


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def gif() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, format="GIF")
    return out.getvalue()


def test_probe_reads_format_and_size_of_a_real_png_and_jpeg() -> None:
    assert (probe(png(30, 20), ImageLimits()).format, probe(png(30, 20), ImageLimits()).pixels
            ) == ("PNG", 600)
    assert probe(jpeg(64, 48), ImageLimits()).format == "JPEG"


@pytest.mark.parametrize(
    ("data", "error", "words"),
    [
        (png(200, 200)[:-40], InvalidInput, "truncated"),
        (png(200, 200)[:30], InvalidInput, "accepted format"),
        (b"plain text, not an image", InvalidInput, "accepted format"),
        (gif(), InvalidInput, "accepted format"),
        (png_claiming(100_000, 100_000), InputTooLarge, "decompression bomb"),
        (png_claiming(10_000, 10_000), InputTooLarge, "decompression bomb"),  # Pillow's warning
        (png_claiming(5000, 10), InputTooLarge, "each side"),
        (png_claiming(3000, 3000), InputTooLarge, "pixels"),
        (png_claiming(2100, 100), InvalidInput, "aspect ratio"),
    ],
    ids=["truncated-data", "truncated-header", "text", "gif", "bomb", "bomb-warning",
         "side", "pixels", "aspect"],
)
def test_probe_refuses_bad_images_with_a_clear_message(
    data: bytes, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        probe(data, ImageLimits(max_side=4096, max_pixels=4_000_000))


def test_raw_image_body_is_admitted_into_the_bin_of_its_pixel_count(
    http: FlaskClient, client: redis.Redis, keys: Keys
) -> None:
    resp = http.post("/submit?model=imgs&priority=2", data=png(300, 300),
                     content_type="image/png")
    assert resp.status_code == 202
    assert resp.get_json()["bin"] == "slow"  # 90,000 pixels > the fast bin's 65,536
    stored = json.loads((records.read(client, keys.job(resp.get_json()["id"])) or {})["input"])
    assert (stored["format"], stored["width"], stored["height"]) == ("PNG", 300, 300)
    assert base64.b64decode(stored["image_b64"]) == png(300, 300)


def test_raw_image_body_takes_wait_in_the_query(http: FlaskClient) -> None:
    # No worker serves it: the short wait ends and the usual 202 comes back.
    resp = http.post("/submit?model=imgs&wait=0.05", data=png(30, 30), content_type="image/png")
    assert resp.status_code == 202, resp.get_json()


def test_multipart_file_is_admitted(http: FlaskClient) -> None:
    resp = http.post("/submit", data={"model": "imgs", "file": (io.BytesIO(jpeg(64, 64)), "a.jpg")},
                     content_type="multipart/form-data")
    assert resp.status_code == 202
    assert resp.get_json()["bin"] == "fast"


def test_base64_json_image_is_admitted(http: FlaskClient) -> None:
    b64 = base64.b64encode(png(16, 16)).decode()
    resp = http.post("/submit", json={"model": "imgs", "input": {"image_b64": b64}})
    assert resp.status_code == 202


@pytest.mark.parametrize(
    ("data", "status"),
    [(png(300, 300)[:-40], 400), (b"not an image", 400), (png_claiming(100_000, 100_000), 413),
     (png_claiming(3000, 3000), 413), (b"", 400)],
    ids=["truncated", "not-an-image", "bomb", "too-many-pixels", "empty"],
)
def test_bad_raw_image_is_refused_before_queueing(
    http: FlaskClient, client: redis.Redis, keys: Keys, data: bytes, status: int
) -> None:
    resp = http.post("/submit?model=imgs", data=data, content_type="image/png")
    assert resp.status_code == status
    assert client.zcard(keys.bin("imgs", "fast")) + client.zcard(keys.bin("imgs", "slow")) == 0


def test_image_over_max_input_bytes_answers_413(http: FlaskClient) -> None:
    too_big = png(16, 16) + b"\0" * (1 << 20)
    resp = http.post("/submit?model=imgs", data=too_big, content_type="image/png")
    assert resp.status_code == 413


def test_invalid_base64_answers_400(http: FlaskClient) -> None:
    resp = http.post("/submit", json={"model": "imgs", "input": {"image_b64": "@@not base64"}})
    assert resp.status_code == 400


def test_image_sent_to_a_json_model_answers_415(http: FlaskClient) -> None:
    resp = http.post("/submit?model=synthetic", data=png(8, 8), content_type="image/png")
    assert resp.status_code == 415


@pytest.mark.parametrize(
    ("query", "status"),
    [("", 400), ("?model=imgs&colour=red", 400), ("?model=imgs&priority=x", 400),
     ("?model=nope", 404)],
    ids=["no-model", "unknown-field", "bad-priority", "unknown-model"],
)
def test_raw_image_with_bad_query_is_refused(http: FlaskClient, query: str, status: int) -> None:
    resp = http.post(f"/submit{query}", data=png(8, 8), content_type="image/png")
    assert resp.status_code == status


def test_multipart_without_exactly_one_file_answers_400(http: FlaskClient) -> None:
    resp = http.post("/submit", data={"model": "imgs"}, content_type="multipart/form-data")
    assert resp.status_code == 400
    assert "exactly one file" in resp.get_json()["error"]["message"]


def test_multipart_that_werkzeug_cannot_parse_answers_400_saying_so(http: FlaskClient) -> None:
    """A filename that is not UTF-8 makes werkzeug drop every part, silently."""
    body = (b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nimgs\r\n'
            b'--B\r\nContent-Disposition: form-data; name="file"; filename="a\xff.png"\r\n'
            b"\r\n" + png(8, 8) + b"\r\n--B--\r\n")
    resp = http.post("/submit", data=body, content_type="multipart/form-data; boundary=B")
    assert resp.status_code == 400
    assert resp.get_json()["error"]["code"] == "malformed_body"
    assert "UTF-8" in resp.get_json()["error"]["message"]
