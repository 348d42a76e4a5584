"""Bad input at the edge, through real gunicorn and a real worker: every kind gets its
status and a message a person can act on, nothing reaches a bin, and the stack keeps
serving. Plus: idempotency through gunicorn, a schemathesis fuzz run that finds no
500, and a pickled Celery message that the worker refuses.
"""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from PIL import Image

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from tests.conftest import make_env
from tests.support.faults import record
from tests.support.procs import REPO_ROOT, log_says, start_web, start_worker, wait_until
from tests.support.redisproc import RedisProc, private_redis
from tests.support.webtools import CATALOGUE_TOML, MAX_BODY_BYTES, jpeg, png, png_claiming

#: Cases per API operation in the fuzz run; a few hundred requests in all.
FUZZ_EXAMPLES = 40
FUZZ_SEED = 20261129
#: Bound on the whole fuzz run, seconds (it takes ~10 s here). Not schemathesis's
#: --max-time: that is a budget it fills, repeating the fuzzing phase.
FUZZ_MAX_S = 240
#: CARPOOL_MAX_WAIT_S of the web the fuzz runs against, seconds: the longest ?wait=
#: the OpenAPI document advertises, so the longest request a valid case can make.
FUZZ_MAX_WAIT_S = 2
#: schemathesis's per-request timeout: FUZZ_MAX_WAIT_S plus room for a slow, shared
#: machine. A request still unanswered after it is a stall, not a long-poll.
FUZZ_REQUEST_TIMEOUT_S = FUZZ_MAX_WAIT_S + 10


@dataclass
class Stack:
    base: str
    server: RedisProc
    prefix: str
    worker_log: Path
    env: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("input-stack")
    config = tmp / "catalogue.toml"
    config.write_text(CATALOGUE_TOML)
    with private_redis() as server:
        env = make_env(server.url, "inputs", CARPOOL_CONFIG=str(config),
                       CARPOOL_MAX_BODY_BYTES=str(MAX_BODY_BYTES),
                       CARPOOL_FILES_DIR=str(tmp / "files"),  # the fuzz uploads /v1 files
                       # Multi-MB bodies back to back each hold the event loop past the
                       # web's shedding bound, which would answer the next ones 503: this
                       # module is about what each input gets (shedding has its own tests).
                       CARPOOL_WEB_MAX_QUEUE_MS="0",
                       CARPOOL_SYNTHETIC_COST_MS="5,0.1")
        log = tmp / "worker.log"
        with start_web(env) as base, \
                start_worker({**env, "CARPOOL_MODELS": "synthetic"}, "w1@inputs", log):
            yield Stack(base, server, "inputs", log, env)


def image_bytes(fmt: str, size: tuple[int, int] = (8, 8)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size).save(out, format=fmt)
    return out.getvalue()


def sjob(**input_: Any) -> dict[str, Any]:
    return {"model": "synthetic", "input": input_}


@dataclass(frozen=True)
class Bad:
    """One bad request: what is sent, and the status and message it must get."""

    name: str
    kwargs: dict[str, Any]
    status: int
    says: str
    method: str = "POST"
    path: str = "/submit"


def _raw(data: bytes, ctype: str = "application/json") -> dict[str, Any]:
    return {"data": data, "headers": {"Content-Type": ctype}}


def _image(data: bytes, ctype: str = "image/png", model: str = "imgs") -> dict[str, Any]:
    return {"data": data, "headers": {"Content-Type": ctype}, "params": {"model": model}}


#: A form whose parts are a nameless one (werkzeug keys it None), an unknown "x",
#: the file and the model.
NAMELESS_PART_FORM = (
    b'--b\r\nContent-Disposition: form-data\r\n\r\nnameless\r\n'
    b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n'
    b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\n'
    + png(8, 8) + b'\r\n--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nimgs\r\n'
    b'--b--\r\n')

CATALOGUE: list[Bad] = [
    Bad("body is not JSON", _raw(b"{nope"), 400, "not valid JSON"),
    Bad("body is not UTF-8", _raw(b'{"model": "\xff\xfe"}'), 400, "not valid JSON"),
    Bad("NaN in JSON", _raw(b'{"model":"synthetic","input":{"value":NaN,"size":1}}'), 400,
        "NaN is not valid JSON"),
    Bad("JSON nested 100k deep", _raw(b"[" * 100_000), 400, "nested too deeply to parse"),
    Bad("input nested 900 deep (was a RecursionError in the worker)",
        _raw(b'{"model":"synthetic","input":{"value":' + b"[" * 900 + b"]" * 900
             + b',"size":10}}'), 400, "input.value[0][0]"),
    Bad("input array of 262,145 items", _raw(b'{"model":"synthetic","input":{"value":['
                                             + b"0," * 262_144 + b'0],"size":1}}'), 400,
        "at most 262144 per array or object (CARPOOL_MAX_INPUT_ITEMS)"),
    Bad("number out of float range (1e999)", _raw(b'{"model":"synthetic","input":'
                                                  b'{"value":1e999,"size":1}}'), 400,
        "the number 1e999 is out of range"),
    Bad("body over CARPOOL_MAX_BODY_BYTES", _raw(b" " * (MAX_BODY_BYTES + 1)), 413,
        f"over {MAX_BODY_BYTES} bytes"),
    Bad("Content-Type text/plain", _raw(b"{}", "text/plain"), 415, "is not accepted here"),
    Bad("body is a JSON array", {"json": [1, 2]}, 400, "must be a JSON object"),
    Bad("unknown model", {"json": {"model": "nope", "input": {}}}, 404, "unknown model 'nope'"),
    Bad("model is a number", {"json": {"model": 7, "input": {}}}, 400, "'model' must be a string"),
    Bad("unknown top-level key", {"json": {**sjob(value=1, size=1), "x": 1}}, 400,
        "unknown keys ['x']"),
    Bad("missing input", {"json": {"model": "synthetic"}}, 400, "lacks ['input']"),
    Bad("size is a string", {"json": sjob(value=1, size="big")}, 400,
        "input.size must be an integer"),
    Bad("size is a bool", {"json": sjob(value=1, size=True)}, 400, "must be an integer"),
    Bad("negative size", {"json": sjob(value=1, size=-1)}, 400, "must be >= 0"),
    Bad("size over the largest bin", {"json": sjob(value=1, size=1025)}, 413,
        "largest bin (1024)"),
    Bad("input over the model's byte limit", {"json": sjob(value="x" * 70_000, size=1)}, 413,
        "takes at most 65536"),
    Bad("unpaired surrogate in input", _raw(b'{"model":"synthetic","input":{"value":"\\ud800",'
                                            b'"size":1}}'), 400, "unpaired surrogate"),
    Bad("deadline_ms 0", {"json": {**sjob(value=1, size=1), "deadline_ms": 0}}, 400,
        "deadline_ms must be between"),
    Bad("priority 99", {"json": {**sjob(value=1, size=1), "priority": 99}}, 400,
        "priority must be between 0 and 9"),
    Bad("idempotency key of 300 chars", {"json": {**sjob(value=1, size=1),
                                                  "idempotency_key": "k" * 300}}, 400,
        "idempotency key must be a string of 1..256"),
    Bad("empty text", {"json": {"model": "texts", "input": {"text": ""}}}, 400,
        "non-empty string"),
    Bad("text over max_chars", {"json": {"model": "texts", "input": {"text": "x" * 1001}}},
        413, "at most 1000"),
    Bad("text with a NUL", {"json": {"model": "texts", "input": {"text": "a\u0000b"}}}, 400,
        "control character U+0000"),
    Bad("text with an escape sequence", {"json": {"model": "texts",
                                                  "input": {"text": "\u001b[31mred"}}}, 400,
        "control character U+001B"),
    Bad("not an image", _image(b"hello, world"), 400, "not an image in an accepted format"),
    Bad("GIF (not on the allow-list)", _image(image_bytes("GIF"), "image/gif"), 400,
        "not an image in an accepted format"),
    Bad("truncated PNG", _image(png(64, 64)[:-40]), 400, "truncated or corrupt"),
    Bad("PNG claiming 30000x30000 (decompression bomb)", _image(png_claiming(30000, 30000)),
        413, "decompression bomb"),
    Bad("PNG with a side over max_side", _image(png_claiming(5000, 100)), 413,
        "each side must be at most 4096"),
    Bad("PNG over max_pixels", _image(png_claiming(2500, 2500)), 413, "at most 4000000 allowed"),
    Bad("PNG 1000x10 (aspect ratio)", _image(png_claiming(1000, 10)), 400,
        "aspect ratio must be at most 20:1"),
    Bad("empty image body", _image(b""), 400, "the image is empty"),
    Bad("image sent to a JSON model", _image(png(8, 8), model="synthetic"), 415,
        "takes a JSON body"),
    Bad("image over max_input_bytes", _image(b"\x89PNG" + b"\0" * (1 << 20)), 413,
        "at most 1048576"),
    Bad("base64 that is not base64", {"json": {"model": "imgs",
                                               "input": {"image_b64": "@@@"}}}, 400,
        "not valid base64"),
    Bad("multipart with two files", {"files": [("file", ("a.png", png(8, 8))),
                                               ("file", ("b.png", png(8, 8)))],
                                     "data": {"model": "imgs"}}, 400, "exactly one file"),
    Bad("multipart with a nameless part (found by the fuzzer: was a 500)",
        _raw(NAMELESS_PART_FORM, "multipart/form-data; boundary=b"), 400,
        "unknown fields ['None', 'x']"),
    Bad("multipart whose filename is not UTF-8 (werkzeug drops every part)",
        _raw(NAMELESS_PART_FORM.replace(b'filename="a.png"', b'filename="a\xff.png"'),
             "multipart/form-data; boundary=b"), 400, "no part of the multipart body"),
    Bad("priority of 5000 digits in a form (found by the fuzzer: was a 500)",
        {"files": {"file": ("a.png", png(8, 8))},
         "data": {"model": "imgs", "priority": "9" * 5000}}, 400,
        "priority must be a non-negative integer"),
    Bad("multipart without a model", {"files": {"file": ("a.jpg", jpeg(8, 8))}}, 400,
        "name the model"),
    Bad("batch of 1001 inputs", {"json": {"model": "synthetic",
                                          "inputs": [{"value": 1, "size": 1}] * 1001}}, 413,
        "at most 1000", path="/submit/batch"),
    Bad("empty batch", {"json": {"model": "synthetic", "inputs": []}}, 400,
        "non-empty array", path="/submit/batch"),
    Bad("malformed job id", {}, 404, "not a job id", method="GET", path="/result/short"),
    Bad("path traversal in a job id", {}, 404, "not found", method="GET",
        path="/result/../../etc/passwd"),
    Bad("job id of 23 characters", {}, 404, "not a job id", method="GET",
        path="/result/" + "A" * 23),
    Bad("job id with unicode", {}, 404, "not a job id", method="GET",
        path="/result/" + "\u0663" * 26),
    Bad("unknown job id", {}, 404, "never submitted", method="GET", path="/result/" + "A" * 26),
    Bad("wait=nan", {}, 400, "wait must be seconds", method="GET",
        path="/result/" + "A" * 26 + "?wait=nan"),
    Bad("wait over the maximum", {}, 400, "wait must be seconds", method="GET",
        path="/result/" + "A" * 26 + "?wait=99999"),
    Bad("PUT on /submit", {}, 405, "not allowed", method="PUT"),
]


def _send(s: requests.Session, base: str, bad: Bad) -> requests.Response:
    return s.request(bad.method, base + bad.path, timeout=30, **bad.kwargs)


def test_each_kind_of_bad_input_gets_its_status_and_message_and_the_stack_keeps_serving(
        stack: Stack) -> None:
    queued = Keys(stack.prefix).any_bin_pattern
    with connect(stack.server.url) as client, requests.Session() as s:
        before = {k: client.zcard(k) for k in client.keys(queued)}
        wrong = []
        for bad in CATALOGUE:
            r = _send(s, stack.base, bad)
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text
            if r.status_code != bad.status or bad.says not in message:
                wrong.append(f"{bad.name}: {r.status_code} {message[:200]}")
        assert wrong == []
        assert {k: client.zcard(k) for k in client.keys(queued)} == before  # nothing queued
        job_id = s.post(f"{stack.base}/submit", json=sjob(value="after", size=1),
                        timeout=10).json()["id"]
        view = s.get(f"{stack.base}/result/{job_id}?wait=20", timeout=30).json()
        assert view["status"] == "done"
    record("catalogue of bad inputs through gunicorn", kinds=len(CATALOGUE),
           statuses=sorted({b.status for b in CATALOGUE}), answered_500=0,
           queued_by_bad_input=0, served_after="yes")


def test_oversized_headers_and_request_lines_are_refused_by_gunicorn_not_crashed(
        stack: Stack) -> None:
    with requests.Session() as s:
        r = s.get(f"{stack.base}/result/{'A' * 26}", headers={"X-Big": "y" * 20_000},
                  timeout=10)
        assert 400 <= r.status_code < 500
        r = s.get(f"{stack.base}/result/{'A' * 9000}", timeout=10)
        assert 400 <= r.status_code < 500
        assert s.get(f"{stack.base}/readyz", timeout=10).status_code == 200


def test_idempotent_submits_through_gunicorn_queue_one_job(stack: Stack) -> None:
    body = sjob(value="once", size=5)
    answers: list[requests.Response] = []
    lock = threading.Lock()

    def send(i: int) -> None:
        with requests.Session() as s:
            if i % 2:
                r = s.post(f"{stack.base}/submit", json=body,
                           headers={"Idempotency-Key": "order-42"}, timeout=10)
            else:
                r = s.post(f"{stack.base}/submit", json={**body, "idempotency_key": "order-42"},
                           timeout=10)
            with lock:
                answers.append(r)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {r.status_code for r in answers} == {202}
    ids = {r.json()["id"] for r in answers}
    assert len(ids) == 1
    assert sum(not r.json().get("duplicate") for r in answers) == 1
    conflict = requests.post(f"{stack.base}/submit", json=sjob(value="other", size=5),
                             headers={"Idempotency-Key": "order-42"}, timeout=10)
    assert conflict.status_code == 422
    assert conflict.json()["error"]["code"] == "idempotency_conflict"
    record("16 concurrent submits with one idempotency key, through gunicorn",
           answered_202=len(answers), jobs_queued=1, other_input_same_key=422)


def test_schemathesis_fuzzing_the_openapi_document_finds_no_server_error(
        stack: Stack, tmp_path: Path) -> None:
    # schemathesis feeds ids from earlier answers (the 202s of /submit) back into
    # GET /result/{job_id}, so it long-polls real jobs; those of models no worker here
    # serves (texts, imgs) stay queued, and ?wait=S then rightly holds the request S
    # seconds (as POST /submit?wait=S does). With the default CARPOOL_MAX_WAIT_S (60)
    # and schemathesis's 10 s request timeout, any drawn wait over 10 s on such a job
    # was reported as "Read timed out". So the fuzz gets its own web, on the same
    # Redis and worker, whose advertised maximum wait is below the request timeout.
    report = tmp_path / "fuzz.json"
    with start_web({**stack.env, "CARPOOL_MAX_WAIT_S": str(FUZZ_MAX_WAIT_S)}) as base:
        doc = requests.get(f"{base}/openapi.json", timeout=10).json()
        waits = [p["schema"]["maximum"] for op in doc["paths"].values()
                 for m in op.values() if isinstance(m, dict)  # not path-level parameters
                 for p in m.get("parameters", ()) if p["name"] == "wait"]
        assert waits and max(waits) == FUZZ_MAX_WAIT_S < FUZZ_REQUEST_TIMEOUT_S, waits
        cmd = [str(Path(sys.executable).parent / "schemathesis"), "run",
               f"{base}/openapi.json", "-n", str(FUZZ_EXAMPLES), "--seed", str(FUZZ_SEED),
               "-w", "1", "--phases", "examples,coverage,fuzzing", "--no-color",
               "--request-timeout", str(FUZZ_REQUEST_TIMEOUT_S),
               "--report", "json", "--report-json-path", str(report)]
        out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=FUZZ_MAX_S, check=False)
    summary = [line for line in out.stdout.splitlines() if "generated" in line]
    assert out.returncode == 0, out.stdout[-3000:]
    record("schemathesis fuzz of /openapi.json against gunicorn", seed=FUZZ_SEED,
           examples_per_operation=FUZZ_EXAMPLES, result=summary[-1].strip() if summary else "",
           server_errors=0)


class _Marker:
    """Unpickling this creates a file: proof that a pickle ran, if the file appears."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def test_a_pickled_message_pushed_into_the_broker_is_refused_and_logged(
        stack: Stack, tmp_path: Path) -> None:
    from kombu import Connection

    from worker.celery_app import CELERY_QUEUE

    marker = tmp_path / "pickle-ran"
    payload = pickle.dumps(((_Marker(marker),), {}, {}))
    with Connection(stack.server.url) as conn:
        producer = conn.Producer(serializer="raw")
        producer.publish(payload, routing_key=CELERY_QUEUE,  # the queue carpool's workers read
                         content_type="application/x-python-serialize", content_encoding="binary",
                         # A task the worker knows (Celery's own), so it gets as far as
                         # decoding the body: an unknown name is dropped before that.
                         headers={"task": "celery.backend_cleanup", "id": "evil-1", "lang": "py",
                                  "argsrepr": "", "kwargsrepr": ""})
    wait_until(lambda: log_says(stack.worker_log, "untrusted content"), 30,
               "the worker to refuse the pickled message")
    assert not marker.exists()
    with requests.Session() as s:  # and it still serves
        job_id = s.post(f"{stack.base}/submit", json=sjob(value="after-pickle", size=1),
                        timeout=10).json()["id"]
        view = s.get(f"{stack.base}/result/{job_id}?wait=20", timeout=30).json()
        assert view["status"] == "done"
    record("pickled Celery message pushed into the broker", executed=False,
           logged="Refusing to deserialize untrusted content", worker_still_serves="yes")

