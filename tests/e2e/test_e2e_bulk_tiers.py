"""A bulk batch's service tier end to end, driven by the unmodified openai SDK: real
gunicorn, Redis and the feeder process. No worker serves the model (it queues, as
from zero), so the bin only fills: one bin of 8 (max_batch 4), of which the feeder
keeps 2 batches' worth, 8 lines, and flex may fill 4."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import requests

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.stack.waiting import wait_until
from tests.conftest import REDIS_URL, make_env
from tests.e2e.test_e2e_bulk import KEY_A, KEY_B, Stack, upload
from tests.support.bulk import embedding_lines, start_feeder
from tests.support.procs import start_web

pytestmark = pytest.mark.e2e

TINY_TOML = """
[models.htiny]
kind = "hashembed"
measure = "tokens"
[models.htiny.options]
dim = 8
max_chars = 4000
[[models.htiny.bins]]
name = "all"
max_size = 2048
max_batch = 4
max_wait_ms = 5
max_depth = 8
"""
#: Bound on the feeder's next steps reaching the bin.
FEED_S = 30.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("batch-tiers")
    (tmp / "catalogue.toml").write_text(TINY_TOML)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(tmp / "catalogue.toml"),
                   CARPOOL_FILES_DIR=str(tmp / "files"),
                   CARPOOL_API_KEYS=f"{KEY_A} tier=flex,{KEY_B}",
                   CARPOOL_BATCH_QUEUED_PER_BIN="2")
    try:
        with start_web(env) as base_url, start_feeder(env, tmp / "feeder.log"):
            running = Stack(base_url, env, tmp, prefix)
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


def tiny(stack: Stack) -> dict[str, Any]:
    models = requests.get(f"{stack.base_url}/models", timeout=10).json()["models"]
    return dict(next(m for m in models if m["name"] == "htiny"))


def test_a_flex_keys_batch_is_fed_into_half_the_bin_then_refused_under_flex(
        stack: Stack) -> None:
    flex, plain = stack.client(KEY_A), stack.client(KEY_B)
    with pytest.raises(openai.BadRequestError, match="above this API key's tier 'default'"):
        plain.batches.create(input_file_id=upload(plain, embedding_lines(1, model="htiny")),
                             endpoint="/v1/embeddings", completion_window="24h",
                             extra_body={"service_tier": "priority"})
    made = flex.batches.create(input_file_id=upload(flex, embedding_lines(10, model="htiny")),
                               endpoint="/v1/embeddings", completion_window="24h")
    assert (made.model_extra or {}).get("service_tier") == "flex"  # its key's
    wait_until(lambda: tiny(stack)["refused_by_tier"]["flex"] > 0, FEED_S,
               "the feeder's flex lines to be refused")
    assert tiny(stack)["bins"][0]["depth"] == 4
    # A default batch fills the rest of what the feeder keeps queued; flex stays at 4.
    plain.batches.create(input_file_id=upload(plain, embedding_lines(10, model="htiny")),
                         endpoint="/v1/embeddings", completion_window="24h")
    wait_until(lambda: tiny(stack)["bins"][0]["depth"] == 8, FEED_S,
               "the default batch's lines to fill the bin")
    assert tiny(stack)["refused_by_tier"]["default"] == 0
    kept = flex.batches.retrieve(made.id)
    assert (kept.status, (kept.model_extra or {}).get("service_tier")) == ("in_progress",
                                                                          "flex")
    assert kept.request_counts is not None and kept.request_counts.total == 10
