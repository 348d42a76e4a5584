"""What the unmodified clients (``tritonclient.http``, the ``openai`` SDK) call and
read, against real gunicorn and a real Celery worker serving the synthetic model and a
hash embedder: calls whose form a first test run left untried."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from tests.conftest import REDIS_URL, make_env
from tests.support.bulk import CATALOGUE_TOML, FINAL, start_feeder, wait_batch
from tests.support.procs import start_web, start_worker, wait_until

httpclient = pytest.importorskip("tritonclient.http")

pytestmark = pytest.mark.e2e

#: A bound on waiting for the worker to say it serves a model.
READY_S = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("clients")
    (tmp / "catalogue.toml").write_text(CATALOGUE_TOML)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(tmp / "catalogue.toml"),
                   CARPOOL_FILES_DIR=str(tmp / "files"), CARPOOL_SYNTHETIC_COST_MS="1,0.01",
                   CARPOOL_DEVICE="cpu")
    try:
        with start_web(env) as base_url, start_worker(
                {**env, "CARPOOL_MODELS": "synthetic,hemb"}), \
                start_feeder(env, tmp / "feeder.log"):
            yield base_url
    finally:
        client = connect(REDIS_URL)
        keys = [k for pattern in Keys(prefix).patterns
                for k in client.scan_iter(match=pattern, count=1000)]
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture
def sdk(stack: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{stack}/v1", api_key="any", max_retries=0) as client:
        yield client


@pytest.fixture
def triton(stack: str) -> Iterator[object]:
    client = httpclient.InferenceServerClient(url=stack.removeprefix("http://"),
                                              network_timeout=60.0)
    wait_until(lambda: client.is_model_ready("synthetic"), READY_S, "synthetic to be ready")
    yield client
    client.close()


def test_statistics_without_a_model_name_every_model(triton: object) -> None:
    """``get_inference_statistics()`` asks ``GET /v2/models/stats``: every model's, as
    Triton answers, not a 404 for a model named "stats"."""
    rows = np.ones((3, 2), dtype=np.float32)
    tensor = httpclient.InferInput("VALUE", [3, 2], "FP32")
    tensor.set_data_from_numpy(rows)
    triton.infer("synthetic", [tensor])
    stats = {s["name"]: s for s in triton.get_inference_statistics()["model_stats"]}
    assert {"synthetic", "hemb"} <= set(stats)
    assert stats["synthetic"]["inference_count"] >= 3
    assert stats["synthetic"] == triton.get_inference_statistics("synthetic")["model_stats"][0]


#: One request line of a batch input file.
LINE = (b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", '
        b'"body": {"model": "hemb", "input": "x"}}\n')


def test_files_list_in_the_order_asked_paging_on(sdk: openai.OpenAI) -> None:
    """``files.list(order="asc")`` lists oldest first, page after page (the SDK pages
    on with ``after``); without it, newest first."""
    line = LINE
    made = [sdk.files.create(file=(f"f{i}.jsonl", line), purpose="batch").id
            for i in range(5)]
    oldest_first = [f.id for f in sdk.files.list(order="asc", limit=2) if f.id in made]
    assert oldest_first == made
    assert [f.id for f in sdk.files.list(limit=2) if f.id in made] == made[::-1]
    with pytest.raises(openai.BadRequestError):
        sdk.files.list(order="sideways")  # type: ignore[arg-type]


def test_a_batch_names_its_model_where_the_sdk_reads_it(sdk: openai.OpenAI) -> None:
    """``Batch.model``: the model the lines name, once validated (None before)."""
    upload = sdk.files.create(file=("one.jsonl", LINE), purpose="batch")
    batch = sdk.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                               completion_window="24h")
    done = wait_batch(sdk, batch.id, FINAL, timeout_s=60.0)
    assert done.status == "completed" and done.model == "hemb"


def test_cancelling_an_ended_batch_is_refused_once_not_retried(
        stack: str, sdk: openai.OpenAI) -> None:
    """The SDK retries a 409 twice by default; an ended batch tells it not to
    (``X-Should-Retry: false``), so the ConflictError comes from one request."""
    upload = sdk.files.create(file=("one.jsonl", LINE), purpose="batch")
    batch = sdk.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                               completion_window="24h")
    wait_batch(sdk, batch.id, FINAL, timeout_s=60.0)
    sent: list[str] = []
    with httpx.Client(event_hooks={"request": [lambda r: sent.append(r.url.path)]}) as http, \
            openai.OpenAI(base_url=f"{stack}/v1", api_key="any", max_retries=2,
                          http_client=http) as retrying:
        with pytest.raises(openai.ConflictError) as refused:
            retrying.batches.cancel(batch.id)
    assert refused.value.code == "not_cancellable"
    assert sent == [f"/v1/batches/{batch.id}/cancel"]


def test_the_sdk_reads_the_error_object_whole(sdk: openai.OpenAI) -> None:
    """OpenAI's error object: the SDK's ``e.type`` and ``e.param`` are read from it, as
    ``e.code`` is (they were None)."""
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.embeddings.create(model="no-such-model", input="x")
    assert (unknown.value.code, unknown.value.type) == ("unknown_model",
                                                        "invalid_request_error")
    assert unknown.value.param is None and "no-such-model" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.embeddings.create(model="hemb", input=[])
    assert bad.value.type == "invalid_request_error"
