"""The feeder's /metrics against the batches it ran, driven by the unmodified openai SDK:
real gunicorn, a real Celery worker serving a hash embedder, Redis and the feeder."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.stack.waiting import wait_until
from tests.conftest import REDIS_URL, make_env
from tests.e2e.test_e2e_bulk import KEY_A, Stack, upload
from tests.support.bulk import (
    CATALOGUE_TOML,
    embedding_lines,
    lines_of,
    start_feeder,
    wait_batch,
)
from tests.support.deployfiles import load_metrics
from tests.support.procs import free_port, start_web, start_worker
from tests.support.promtext import Scrape, scrape

pytestmark = pytest.mark.e2e

#: Bound on the feeder's gauge catching up with the step that ended a batch.
SETTLE_S = 10.0
FEEDER_METRICS = {n: m for n, m in load_metrics().items() if n.startswith("carpool_feeder_")}


@dataclass
class MetricsStack(Stack):
    metrics_url: str = ""

    def scrape(self) -> Scrape:
        return scrape(self.metrics_url)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsStack]:
    tmp = tmp_path_factory.mktemp("batch-metrics")
    (tmp / "catalogue.toml").write_text(CATALOGUE_TOML)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    port = free_port()
    env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(tmp / "catalogue.toml"),
                   CARPOOL_FILES_DIR=str(tmp / "files"), CARPOOL_SYNTHETIC_COST_MS="1,0.01",
                   CARPOOL_API_KEYS=KEY_A)
    feeder_env = {**env, "CARPOOL_FEEDER_METRICS_PORT": str(port),
                  "CARPOOL_WORKER_METRICS_ADDR": "127.0.0.1"}
    try:
        with start_web(env) as base_url, start_worker({**env, "CARPOOL_MODELS": "hemb"}), \
                start_feeder(feeder_env, tmp / "feeder.log"):
            running = MetricsStack(base_url, env, tmp, prefix,
                                   metrics_url=f"http://127.0.0.1:{port}/metrics")
            yield running
            for c in running.clients.values():
                c.close()
    finally:
        client = connect(REDIS_URL)
        keys = [k for pattern in Keys(prefix).patterns
                for k in client.scan_iter(match=pattern, count=1000)]
        if keys:
            client.delete(*keys)
        client.close()


def counts(s: Scrape) -> dict[str, float]:
    """Lines admitted and stored by outcome; batches ended by status (``batch_<status>``)."""
    return {"admitted": s.value("carpool_feeder_lines_admitted_total"),
            "done": s.value("carpool_feeder_lines_stored_total", outcome="done"),
            "failed": s.value("carpool_feeder_lines_stored_total", outcome="failed"),
            **{f"batch_{status}": s.value("carpool_feeder_batches_ended_total", status=status)
               for status in ("completed", "failed", "expired", "cancelled")}}


def change(stack: MetricsStack, before: dict[str, float]) -> dict[str, float]:
    after = counts(settled(stack))
    return {k: after[k] - before[k] for k in after}


def settled(stack: MetricsStack) -> Scrape:
    """A scrape once the feeder holds no batch (its gauge is set after each step)."""
    wait_until(lambda: stack.scrape().value("carpool_feeder_batches_running") == 0,
               SETTLE_S, "the feeder to hold no batch")
    return stack.scrape()


def test_the_feeder_serves_every_listed_feeder_metric_with_its_type_and_labels(
        stack: MetricsStack) -> None:
    s = stack.scrape()
    emitted = {n: f for n, f in s.families.items() if n.startswith("carpool_feeder_")}
    assert set(emitted) == set(FEEDER_METRICS)
    for name, family in emitted.items():
        assert (family.type, family.labels) == (FEEDER_METRICS[name].type,
                                                set(FEEDER_METRICS[name].labels)), name


def test_feeder_metrics_count_each_batch_s_lines_and_its_final_status(
        stack: MetricsStack) -> None:
    client = stack.client()
    before = counts(settled(stack))
    n = 40
    done = client.batches.create(input_file_id=upload(client, embedding_lines(n, prefix="m")),
                                 endpoint="/v1/embeddings", completion_window="24h")
    done = wait_batch(client, done.id, {"completed", "failed"}, timeout_s=60)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (n, 0)
    assert change(stack, before) == {
        "admitted": n, "done": n, "failed": 0, "batch_completed": 1, "batch_failed": 0,
        "batch_expired": 0, "batch_cancelled": 0}


def test_feeder_metrics_count_a_cancelled_batch_s_error_lines_as_failed(
        stack: MetricsStack) -> None:
    client = stack.client()
    before = counts(settled(stack))
    n = 3000
    batch = client.batches.create(input_file_id=upload(client, embedding_lines(n, prefix="c")),
                                  endpoint="/v1/embeddings", completion_window="24h")
    wait_batch(client, batch.id, {"in_progress"}, timeout_s=30)
    wait_until(lambda: stack.scrape().value("carpool_feeder_batches_running") == 1, SETTLE_S,
               "the feeder's gauge to show the batch it runs")
    client.batches.cancel(batch.id)
    ended = wait_batch(client, batch.id, {"cancelled"}, timeout_s=60)
    rc = ended.request_counts
    assert rc is not None and rc.failed > 0 and rc.completed + rc.failed == n
    delta = change(stack, before)
    assert (delta["done"], delta["failed"]) == (rc.completed, rc.failed)
    assert (delta["batch_cancelled"], delta["batch_completed"], delta["batch_failed"],
            delta["batch_expired"]) == (1, 0, 0, 0)
    assert rc.completed <= delta["admitted"] <= n  # a line cut off unadmitted counts failed


def test_a_batch_failing_validation_counts_one_failed_batch_and_no_lines(
        stack: MetricsStack) -> None:
    client = stack.client()
    before = counts(settled(stack))
    batch = client.batches.create(input_file_id=upload(client, b"not json\n"),
                                  endpoint="/v1/embeddings", completion_window="24h")
    assert wait_batch(client, batch.id, {"failed", "completed"}, timeout_s=30).status == "failed"
    assert change(stack, before) == {
        "admitted": 0, "done": 0, "failed": 0, "batch_completed": 0, "batch_failed": 1,
        "batch_expired": 0, "batch_cancelled": 0}
    assert stack.scrape().value("carpool_feeder_step_seconds_count") > 0


def test_a_lines_dimensions_is_checked_as_post_v1_embeddings_checks_it(
        stack: MetricsStack) -> None:
    """The model's vectors have 8 dimensions: a line asking for 5 answers the 400 that
    ``POST /v1/embeddings`` answers (no truncation), in the error file, counted failed;
    8 or none, 200."""
    client = stack.client()
    before = counts(settled(stack))
    with pytest.raises(openai.BadRequestError, match="dimensions=5"):
        client.embeddings.create(model="hemb", input="a cat", dimensions=5)
    asked = {"eight": 8, "five": 5, "any": None}
    data = "".join(json.dumps({"custom_id": name, "method": "POST", "url": "/v1/embeddings",
                               "body": {"model": "hemb", "input": "a cat",
                                        **({} if dims is None else {"dimensions": dims})}})
                   + "\n" for name, dims in asked.items()).encode()
    batch = client.batches.create(input_file_id=upload(client, data),
                                  endpoint="/v1/embeddings", completion_window="24h")
    done = wait_batch(client, batch.id, {"completed", "failed"}, timeout_s=60)
    assert done.status == "completed", done.errors
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    assert change(stack, before) == {
        "admitted": 3, "done": 2, "failed": 1, "batch_completed": 1, "batch_failed": 0,
        "batch_expired": 0, "batch_cancelled": 0}
    out = {line["custom_id"]: line for line in lines_of(client, done.output_file_id)}
    (refused,) = lines_of(client, done.error_file_id)
    assert sorted(out) == ["any", "eight"]
    assert all(len(line["response"]["body"]["data"][0]["embedding"]) == 8
               for line in out.values())
    assert refused["custom_id"] == "five" and refused["response"]["status_code"] == 400
    assert refused["response"]["body"]["error"] == {
        "code": "invalid_input", "message": "dimensions=5: this model's vectors have 8 "
                                            "dimensions",
        "type": "invalid_request_error", "param": "dimensions"}
