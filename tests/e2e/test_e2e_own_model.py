"""A user's own handlers (``kind = "python"``) served end to end: real gunicorn and a
real Celery worker run the two examples under ``examples/`` — a torch.export tensor
model (weights this test makes) and a Hugging Face sequence classifier built from a
config with random weights — from their catalogue files, with the example folders
on the worker's PYTHONPATH as a user's own packages would be."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from tests.conftest import REDIS_URL, make_env
from tests.support.procs import REPO_ROOT, start_web, start_worker

pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLES = REPO_ROOT / "examples"


def catalogue(tmp: Path, weights: Path) -> str:
    """Both examples' catalogue files as shipped, the tensor model's weights made here."""
    tensor = (EXAMPLES / "tensor_model" / "catalogue.toml").read_text()
    tensor = tensor.replace('weights = "/tmp/mlp.pt2"', f'weights = "{weights}"')
    tensor = tensor.replace('input_schema = "schema.json"',
                            f'input_schema = "{EXAMPLES / "tensor_model" / "schema.json"}"')
    assert str(weights) in tensor and "schema.json\"" in tensor, "the shipped file changed"
    return tensor + (EXAMPLES / "text_classifier" / "catalogue.toml").read_text()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("own-model")
    weights = tmp / "mlp.pt2"
    subprocess.run([sys.executable, str(EXAMPLES / "tensor_model" / "make_weights.py"),
                    str(weights)], check=True, capture_output=True, timeout=300)
    (tmp / "catalogue.toml").write_text(catalogue(tmp, weights))
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    path = os.pathsep.join([str(EXAMPLES / "tensor_model"), str(EXAMPLES / "text_classifier"),
                            str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(tmp / "catalogue.toml"),
                   CARPOOL_DEVICE="cpu", CARPOOL_PROFILE_DIR=str(tmp / "profiles"))
    try:
        # The web runs WITHOUT the examples on its path: it never imports a handler.
        with start_web(env) as base_url, start_worker(
                {**env, "PYTHONPATH": path, "CARPOOL_MODELS": "tensor,sentiment"}):
            yield base_url
    finally:
        client = connect(REDIS_URL)
        keys = [k for pattern in Keys(prefix).patterns
                for k in client.scan_iter(match=pattern, count=1000)]
        if keys:
            client.delete(*keys)
        client.close()


def submit(base: str, model: str, job_input: Any) -> requests.Response:
    return requests.post(f"{base}/submit", json={"model": model, "input": job_input},
                         timeout=30)


def result(base: str, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = requests.get(f"{base}/result/{job_id}?wait=60", timeout=90).json()
    return body


def reference_outputs(rows: list[list[float]]) -> list[list[float]]:
    """What the example's MLP computes, from the same seed, in this process."""
    import torch

    sys.path.insert(0, str(EXAMPLES / "tensor_model"))
    try:
        from make_weights import mlp
    finally:
        sys.path.remove(str(EXAMPLES / "tensor_model"))
    with torch.inference_mode():
        out: list[list[float]] = mlp()(torch.tensor(rows)).tolist()
    return out


def test_exported_tensor_model_answers_each_job_with_its_own_row(stack: str) -> None:
    rows = [[float(i + j) / 10 for j in range(16)] for i in range(5)]
    ids = []
    for row in rows:
        resp = submit(stack, "tensor", {"tensor": row})
        assert resp.status_code == 202, resp.text
        assert resp.json()["bin"] == "all"
        ids.append(resp.json()["id"])
    expected = reference_outputs(rows)
    for job_id, want in zip(ids, expected, strict=True):
        body = result(stack, job_id)
        assert body["status"] == "done", body
        got = body["result"]["output"]
        assert all(math.isclose(g, w, abs_tol=1e-4) for g, w in zip(got, want, strict=True))


def strict_json(text: str) -> Any:
    """``text`` parsed as RFC 8259 JSON, which has no NaN or Infinity (as JavaScript's
    ``JSON.parse`` and Go's decoder refuse them)."""
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_a_model_output_that_overflows_fails_its_job_and_every_answer_stays_json(
        stack: str) -> None:
    huge, fine = [3e38] * 16, [0.5] * 16  # within float32's range; the layers overflow
    assert not all(math.isfinite(v) for v in reference_outputs([huge])[0])
    ids = [submit(stack, "tensor", {"tensor": row}).json()["id"] for row in (huge, fine)]
    answers = [requests.get(f"{stack}/result/{job_id}?wait=60", timeout=90).text
               for job_id in ids]
    overflowed, other = (strict_json(text) for text in answers)
    assert overflowed["status"] == "failed", overflowed
    assert "NaN or Infinity" in overflowed["error"]
    assert other["status"] == "done", other


def test_web_checks_a_python_models_input_against_its_schema(stack: str) -> None:
    short = submit(stack, "tensor", {"tensor": [1.0, 2.0]})
    assert short.status_code == 400
    assert "input.tensor" in short.json()["error"]["message"]
    unknown = submit(stack, "tensor", {"tensor": [0.0] * 16, "extra": 1})
    assert unknown.status_code == 400
    wrong_type = submit(stack, "sentiment", {"text": 5})
    assert wrong_type.status_code == 400
    assert "input.text" in wrong_type.json()["error"]["message"]


def test_openapi_publishes_each_python_models_own_schema(stack: str) -> None:
    doc = requests.get(f"{stack}/openapi.json", timeout=10).json()
    schemas = doc["components"]["schemas"]
    assert schemas["Input_tensor"]["properties"]["tensor"]["minItems"] == 16
    assert schemas["Input_sentiment"]["required"] == ["text"]


def test_hf_classifier_bins_texts_by_tokens_and_labels_each(stack: str) -> None:
    texts = {"a fine day": "t32", " ".join(["word"] * 60): "t128"}
    ids = {}
    for text, want_bin in texts.items():
        resp = submit(stack, "sentiment", {"text": text})
        assert resp.status_code == 202, resp.text
        assert resp.json()["bin"] == want_bin
        ids[text] = resp.json()["id"]
    for job_id in ids.values():
        body = result(stack, job_id)
        assert body["status"] == "done", body
        scores = body["result"]["scores"]
        assert set(scores) == {"negative", "neutral", "positive"}
        assert body["result"]["label"] == max(scores, key=scores.__getitem__)
        assert math.isclose(sum(scores.values()), 1.0, abs_tol=1e-3)
