"""Bulk batches end to end, driven by the unmodified openai SDK: real gunicorn, a
real Celery worker serving a hash embedder, Redis and the feeder process."""

from __future__ import annotations

import io
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.stack.waiting import wait_until
from tests.conftest import REDIS_URL, make_env
from tests.support.bulk import (
    CATALOGUE_TOML,
    FINAL,
    SLOW_COST_MS,
    SLOW_MAX_LINES_PER_S,
    SLOW_MODEL_TOML,
    embedding_lines,
    lines_of,
    start_feeder,
    wait_batch,
)
from tests.support.procs import start_web, start_worker
from worker.handlers.hashembed import hash_vector

pytestmark = pytest.mark.e2e

KEY_A, KEY_B = "key-a-" + "a" * 24, "key-b-" + "b" * 24


@dataclass
class Stack:
    base_url: str
    env: dict[str, str]
    tmp: Path
    prefix: str
    clients: dict[str, openai.OpenAI] = field(default_factory=dict)

    def client(self, key: str = KEY_A) -> openai.OpenAI:
        """One SDK client per key, closed with the stack (its connections too)."""
        if key not in self.clients:
            self.clients[key] = openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=key,
                                              max_retries=0)
        return self.clients[key]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("batches")
    (tmp / "catalogue.toml").write_text(CATALOGUE_TOML + SLOW_MODEL_TOML)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(tmp / "catalogue.toml"),
                   CARPOOL_FILES_DIR=str(tmp / "files"), CARPOOL_SYNTHETIC_COST_MS="1,0.01",
                   CARPOOL_API_KEYS=f"{KEY_A},{KEY_B}", CARPOOL_BATCH_MAX_LINES="20000")
    try:
        with start_web(env) as base_url, start_worker({**env, "CARPOOL_MODELS": "hemb"}), \
                start_feeder(env, tmp / "feeder.log"):
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


class DepthSampler:
    """The deepest each of hemb's bins got, read from Redis in a thread meanwhile."""

    def __init__(self, prefix: str) -> None:
        self.keys, self.max = Keys(prefix), {"short": 0, "long": 0}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = connect(REDIS_URL)
        try:
            while not self.stop.wait(0.005):
                for name in self.max:
                    depth = int(client.zcard(self.keys.bin("hemb", name)))
                    self.max[name] = max(self.max[name], depth)
        finally:
            client.close()

    def __enter__(self) -> DepthSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def upload(client: openai.OpenAI, data: bytes) -> str:
    return client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id


def test_embeddings_create_answers_openai_shape_with_the_model_vectors(stack: Stack) -> None:
    answer = stack.client().embeddings.create(model="hemb", input=["a cat", "a dog"])
    assert [d.index for d in answer.data] == [0, 1]
    assert answer.data[0].embedding == pytest.approx(hash_vector("a cat", 8), abs=1e-6)
    assert answer.data[1].embedding == pytest.approx(hash_vector("a dog", 8), abs=1e-6)
    assert answer.usage.prompt_tokens == 4
    as_floats = stack.client().embeddings.create(model="hemb", input="a cat",
                                                 encoding_format="float")
    assert as_floats.data[0].embedding == pytest.approx(hash_vector("a cat", 8), abs=1e-6)


def test_a_20000_line_batch_completes_with_every_custom_id_exactly_once(stack: Stack) -> None:
    client = stack.client()
    n = 20_000
    file_id = upload(client, embedding_lines(n))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                  completion_window="24h", metadata={"run": "big"})
    assert batch.status == "validating" and batch.metadata == {"run": "big"}
    with DepthSampler(stack.prefix) as depths:
        seen = wait_batch(client, batch.id, {"in_progress"}, timeout_s=60)
        projected = None
        while seen.status == "in_progress" and projected is None:
            seen = client.batches.retrieve(batch.id)
            projected = (seen.model_extra or {}).get("carpool", {}).get(
                "projected_completion_at")
        done = wait_batch(client, batch.id, {"completed", "failed"}, timeout_s=240)
    # Paced: never more than CARPOOL_BATCH_QUEUED_PER_BIN (2) full batches per bin.
    assert 0 < depths.max["short"] <= 2 * 256 and depths.max["long"] <= 2 * 64
    assert projected is not None and projected >= seen.in_progress_at
    assert done.status == "completed", done.errors
    assert done.request_counts.total == n and done.request_counts.completed == n
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    out = lines_of(client, done.output_file_id)
    err = lines_of(client, done.error_file_id)
    ids = [line["custom_id"] for line in out + err]
    assert len(ids) == n and set(ids) == {f"req-{i}" for i in range(n)}
    assert err == []
    for line in out[:50]:
        i = int(line["custom_id"].split("-")[1])
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200
        assert body["data"][0]["embedding"] == pytest.approx(
            hash_vector(f"text number {i}", 8), abs=1e-6)


def test_two_api_keys_share_the_idle_capacity(stack: Stack) -> None:
    """B's small batch, sent just after A's large one, ends long before A's."""
    a, b = stack.client(KEY_A), stack.client(KEY_B)
    big = a.batches.create(input_file_id=upload(a, embedding_lines(10_000, prefix="fa")),
                           endpoint="/v1/embeddings", completion_window="24h")
    wait_batch(a, big.id, {"in_progress"}, timeout_s=30)
    small = b.batches.create(input_file_id=upload(b, embedding_lines(300, prefix="fb")),
                             endpoint="/v1/embeddings", completion_window="24h")
    wait_batch(b, small.id, {"completed"}, timeout_s=60)
    at_that_time = a.batches.retrieve(big.id)
    assert at_that_time.request_counts is not None
    assert at_that_time.request_counts.completed < 10_000 - 2000, at_that_time.request_counts
    wait_batch(a, big.id, {"completed"}, timeout_s=120)


def test_a_malformed_file_fails_validation_naming_each_bad_line(stack: Stack) -> None:
    client = stack.client()
    good = embedding_lines(1).decode().strip()
    bad = "\n".join([
        good,
        "not json",
        '{"custom_id": "x", "method": "GET", "url": "/v1/embeddings", "body": {}}',
        good,  # custom_id repeated
        '{"custom_id": "y", "method": "POST", "url": "/v1/embeddings", '
        '"body": {"model": "nope", "input": "a"}}',
        '{"custom_id": "z", "method": "POST", "url": "/v1/embeddings", '
        '"body": {"model": "hemb", "input": ""}}',
    ]).encode() + b"\n\xff\xfe{}\n"
    batch = client.batches.create(input_file_id=upload(client, bad),
                                  endpoint="/v1/embeddings", completion_window="24h")
    failed = wait_batch(client, batch.id, {"failed", "completed"}, timeout_s=30)
    assert failed.status == "failed" and failed.errors is not None
    lines = [e.line for e in failed.errors.data]
    assert lines == [2, 3, 4, 5, 6, 7], failed.errors
    assert "custom_id" in failed.errors.data[2].message
    assert "UTF-8" in failed.errors.data[5].message


def test_a_line_nested_past_the_input_depth_fails_validation_naming_its_line(
        stack: Stack) -> None:
    client = stack.client()

    def submit_line(custom_id: str, value: str) -> str:
        return (f'{{"custom_id": "{custom_id}", "method": "POST", "url": "/submit", "body": '
                f'{{"model": "synthetic", "input": {{"value": {value}, "size": 1}}}}}}')

    data = (submit_line("a", "1") + "\n" + submit_line("b", "[" * 900 + "]" * 900)).encode()
    batch = client.batches.create(input_file_id=upload(client, data),
                                  endpoint="/submit",
                                  completion_window="24h")
    failed = wait_batch(client, batch.id, {"failed", "completed"}, timeout_s=30)
    assert failed.status == "failed" and failed.errors is not None
    [error] = failed.errors.data
    assert error.line == 2 and error.message is not None
    assert error.message.startswith("input.value[0][0]")
    assert "CARPOOL_MAX_INPUT_DEPTH" in error.message


def test_batches_are_scoped_to_their_api_key_and_listed_newest_first(stack: Stack) -> None:
    a, b = stack.client(KEY_A), stack.client(KEY_B)
    file_id = upload(a, embedding_lines(3, prefix="scoped"))
    with pytest.raises(openai.NotFoundError):
        b.files.retrieve(file_id)
    ids = [a.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                            completion_window="24h").id for _ in range(3)]
    with pytest.raises(openai.NotFoundError):
        b.batches.retrieve(ids[0])
    first = a.batches.list(limit=2)
    assert [x.id for x in first.data] == ids[::-1][:2] and first.has_more
    rest = a.batches.list(limit=2, after=first.data[-1].id)
    assert rest.data[0].id == ids[0]
    assert all(x.id not in ids for x in b.batches.list(limit=100).data)


def test_cancel_ends_cancelled_with_every_line_in_one_file(stack: Stack) -> None:
    client = stack.client()
    n = 3000
    file_id = upload(client, embedding_lines(n, prefix="cancel"))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                  completion_window="24h")
    wait_batch(client, batch.id, {"in_progress"}, timeout_s=30)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_batch(client, batch.id, {"cancelled"}, timeout_s=60)
    out, err = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    ids = [line["custom_id"] for line in out + err]
    assert sorted(ids) == sorted(f"cancel-{i}" for i in range(n))
    assert all(line["error"]["code"] == "batch_cancelled" for line in err)


#: A window that ``WINDOW_LINES`` lines of hslow cannot meet on any machine (they take
#: at least WINDOW_LINES / SLOW_MAX_LINES_PER_S = 25 s), long enough that the feeder
#: has projected the miss well before it ends (a projection needs a second of work).
WINDOW_S, WINDOW_LINES = 15, 2000


def test_a_window_that_passes_expires_the_batch_keeping_what_finished(stack: Stack) -> None:
    assert WINDOW_LINES / SLOW_MAX_LINES_PER_S > WINDOW_S + 5
    client = stack.client()
    file_id = upload(client, embedding_lines(WINDOW_LINES, model="hslow", prefix="exp"))
    with start_worker({**stack.env, "CARPOOL_MODELS": "hslow",
                       "CARPOOL_SYNTHETIC_COST_MS": SLOW_COST_MS}, node_name="slow@carpool-test"):
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                      completion_window=f"{WINDOW_S}s")
        seen = [wait_batch(client, batch.id, {"in_progress"}, timeout_s=WINDOW_S)]

        def at_risk_or_over() -> bool:
            seen[0] = client.batches.retrieve(batch.id)
            return seen[0].status != "in_progress" or bool(
                (seen[0].model_extra or {}).get("carpool", {}).get("window_at_risk"))

        wait_until(at_risk_or_over, 2 * WINDOW_S, "the window at risk, or the batch over")
        assert seen[0].status == "in_progress", "the document never said the window would " \
            "be missed"
        done = wait_batch(client, batch.id, FINAL, timeout_s=60)
    assert done.status == "expired"
    out, err = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    ids = [line["custom_id"] for line in out + err]
    assert sorted(ids) == sorted(f"exp-{i}" for i in range(WINDOW_LINES))
    assert out and err and all(line["error"]["code"] == "batch_expired" for line in err)
    counts = done.request_counts
    assert counts is not None and (counts.completed, counts.failed) == (len(out), len(err))


def test_an_upload_past_the_file_limit_is_cut_off_under_gunicorn(tmp_path: Path) -> None:
    """Chunked (no Content-Length, as an endless upload is): refused at the limit."""
    import http.client
    from urllib.parse import urlsplit

    env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:8]}",
                   CARPOOL_FILES_DIR=str(tmp_path / "files"),
                   CARPOOL_BATCH_MAX_FILE_BYTES="65536")
    sent = [0]

    def body() -> Iterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n'
        while sent[0] < 4 << 20:  # far past the limit; a server that reads on never ends
            sent[0] += 65536
            yield b"x" * 65536

    with start_web(env) as base_url:
        url = urlsplit(base_url)
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
        try:
            conn.request("POST", "/v1/files", body=body(), encode_chunked=True,
                         headers={"Content-Type": "multipart/form-data; boundary=b"})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed after answering: the answer is still there to read
        try:
            resp = conn.getresponse()
            assert resp.status == 413, resp.read()
            assert b"body_too_large" in resp.read()
        finally:
            conn.close()


def test_the_cli_submits_a_file_of_inputs_and_writes_the_results(stack: Stack) -> None:
    import json
    import subprocess
    import sys

    inputs = stack.tmp / "texts.jsonl"
    inputs.write_text("".join(json.dumps({"text": f"cli text {i}"}) + "\n" for i in range(200)))
    cli = [sys.executable, "-m", "carpool.cli", "batch"]
    auth = ["--url", stack.base_url, "--api-key", KEY_A]
    submitted = subprocess.run([*cli, "submit", str(inputs), "--model", "hemb",
                                "--endpoint", "/v1/embeddings", *auth],
                               capture_output=True, text=True, timeout=60, check=True)
    batch_id = submitted.stdout.strip()
    out = stack.tmp / "out.jsonl"
    got = subprocess.run([*cli, "results", batch_id, "-o", str(out), *auth],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert "200/200 completed" in got.stderr and "[" in got.stderr  # the progress bar
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(x["custom_id"] for x in lines) == sorted(f"line-{i}" for i in range(1, 201))
    first = next(x for x in lines if x["custom_id"] == "line-1")
    assert first["response"]["body"]["data"][0]["embedding"] == pytest.approx(
        hash_vector("cli text 0", 8), abs=1e-6)
    status = subprocess.run([*cli, "status", batch_id, *auth], capture_output=True, text=True,
                            timeout=60, check=True)
    assert json.loads(status.stdout)["status"] == "completed"


def test_an_upload_that_drips_is_answered_408_in_its_time(tmp_path: Path) -> None:
    import socket
    import time
    from urllib.parse import urlsplit

    env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:8]}",
                   CARPOOL_FILES_DIR=str(tmp_path / "files"), CARPOOL_BODY_TIMEOUT_S="1",
                   CARPOOL_BODY_MIN_RATE="1000000")
    with start_web(env) as base_url:
        url = urlsplit(base_url)
        with socket.create_connection((url.hostname or "", url.port or 0), timeout=30) as s:
            s.sendall(b"POST /v1/files HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n"
                      b"Content-Type: multipart/form-data; boundary=b\r\n\r\n--b")
            start = time.monotonic()
            raw = b""
            while b"\r\n\r\n" not in raw:  # the server answers while we still owe bytes
                chunk = s.recv(4096)
                if not chunk:
                    break
                raw += chunk
            assert raw.startswith(b"HTTP/1.1 408"), raw[:200]
            assert time.monotonic() - start < 10


def test_carpool_up_runs_the_feeder_with_files_under_its_state_folder(tmp_path: Path) -> None:
    import json
    import os
    import signal
    import subprocess
    import sys

    from carpool.stack.redis_local import free_port, start_redis
    from tests.support.procs import REPO_ROOT, answers

    server = start_redis(tmp_path / "redis")
    port = free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "carpool.cli", "up", "--no-flower", "--port", str(port),
         "--redis-url", server.url, "--state-dir", str(tmp_path / "state"),
         "--models", "synthetic"], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env={**os.environ, "CARPOOL_WORKER_METRICS_PORT": "0",
                                        "CARPOOL_FILES_DIR": ""})
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/readyz"), 120, "carpool up")
        lines = "".join(json.dumps({"custom_id": f"s{i}", "method": "POST", "url": "/submit",
                                    "body": {"model": "synthetic",
                                             "input": {"value": i, "size": 4}}}) + "\n"
                        for i in range(20)).encode()
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-") as client:
            batch = client.batches.create(input_file_id=upload(client, lines),
                                          endpoint="/submit", completion_window="24h")
            done = wait_batch(client, batch.id, {"completed", "failed"}, timeout_s=120)
            assert done.status == "completed", done
            out = lines_of(client, done.output_file_id)
        assert sorted(x["custom_id"] for x in out) == sorted(f"s{i}" for i in range(20))
        assert out[0]["response"]["body"]["status"] == "done"
        assert (tmp_path / "state" / "files" / "files" / str(done.output_file_id)).exists()
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
        server.stop()
