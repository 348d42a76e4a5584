"""Real gunicorn (gevent workers): a thousand open long-polls do not stop submits."""

from __future__ import annotations

import json
import selectors
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import requests

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.queue import Queue
from carpool.core.jobs import Outcome, new_job_id
from carpool.core.settings import load_settings
from tests.conftest import make_env
from tests.support.procs import open_files_at_least, start_web

POLLS = 1000
SUBMITS = 20
#: Bound on one submit while the polls wait: a bound against hanging, not a benchmark
#: (a loaded 2-core machine took over 5 s to answer one while 1,000 polls connected).
SUBMIT_TIMEOUT_S = 20.0
#: Bound on every poll answering once its job is done: well under the polls'
#: 30 s wait, so only polls that the completion woke answer in time.
ANSWER_TIMEOUT_S = 20.0
#: Client sockets, gunicorn's sockets and its Redis connections, with room to spare.
FDS_NEEDED = 4 * POLLS


@pytest.fixture
def enough_fds() -> Iterator[None]:
    """Raise the soft open-files limit (gunicorn inherits it); put it back afterwards."""
    with open_files_at_least(FDS_NEEDED):
        yield


def open_poll(port: int, job_id: str) -> socket.socket:
    """A socket that has sent `GET /result/<id>?wait=30` and reads nothing yet."""
    s = socket.create_connection(("127.0.0.1", port), timeout=SUBMIT_TIMEOUT_S)
    s.sendall(f"GET /result/{job_id}?wait=30 HTTP/1.1\r\nHost: test\r\n"
              "Connection: close\r\n\r\n".encode())
    s.setblocking(False)
    return s


def read_answers(polls: dict[socket.socket, str], timeout_s: float) -> dict[str, bytes]:
    """Each poll's whole answer (the server closes after it), by job id."""
    sel = selectors.DefaultSelector()
    buffers = {s: bytearray() for s in polls}
    for s in polls:
        sel.register(s, selectors.EVENT_READ, data=s)
    answers: dict[str, bytes] = {}
    deadline = time.monotonic() + timeout_s
    while len(answers) < len(polls) and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
            s = key.data
            chunk = s.recv(65536)
            if chunk:
                buffers[s] += chunk
            else:
                sel.unregister(s)
                answers[polls[s]] = bytes(buffers[s])
    sel.close()
    return answers


def parse(answer: bytes) -> tuple[int, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_thousand_long_polls_wait_while_new_submits_are_answered(
    enough_fds: None, redis_url: str, key_prefix: str, queue: Queue, client: redis.Redis
) -> None:
    env = make_env(redis_url, key_prefix)
    spec = load_settings(env).catalogue.get("synthetic")
    small = spec.bins[0]
    job_ids = [single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        spec, (AdmitJob(small, new_job_id(spec.name), '{"size":1,"value":0}'),),
        queued_ttl_s=600))).id for _ in range(POLLS)]
    with start_web(env) as base_url:
        port = int(base_url.rsplit(":", 1)[1])
        polls = {open_poll(port, job_id): job_id for job_id in job_ids}
        try:
            # One listen socket, one FIFO accept queue: a submit that connects after
            # every poll and is answered shows that every poll was accepted too.
            for i in range(SUBMITS):
                resp = requests.post(f"{base_url}/submit", timeout=SUBMIT_TIMEOUT_S,
                                     json={"model": "synthetic", "input": {"value": i, "size": 1}})
                assert resp.status_code == 202, resp.text
            early = read_answers(polls, timeout_s=0.1)
            assert early == {}, f"answered before their jobs ended: {list(early.values())[:3]}"

            claim = queue.claim(spec, small.name, POLLS + SUBMITS, lease_ms=60_000,
                                token=uuid.uuid4().hex, worker="test")
            assert {j.id for j in claim.jobs} >= set(job_ids)
            queue.complete(spec, claim, [Outcome(j.id, result=j.id) for j in claim.jobs],
                           {"size": len(claim.jobs), "bin": small.name, "worker": "test"})

            answers = read_answers(polls, timeout_s=ANSWER_TIMEOUT_S)
        finally:
            for s in polls:
                s.close()
    assert len(answers) == POLLS
    parsed = {job_id: parse(raw) for job_id, raw in answers.items()}
    bad = [b for s, b in parsed.values() if s != 200]
    assert not bad, f"{len(bad)} bad answers, e.g. {bad[:2]}"
    assert all(body["status"] == "done" and body["result"] == job_id
               for job_id, (_, body) in parsed.items())
