"""`carpool batch status --wait` and `batch results` (carpool/client/bulk.py) wait through
what a web restart looks like from outside, 503, 429 and refused connections, against a
real scripted server; and give up, saying what they saw last, only past their bound."""

from __future__ import annotations

import json

import pytest

from carpool.cli import main
from carpool.client import ClientError, RequestRejected, RetryPolicy
from carpool.client.bulk import POLL_S, Bulk
from tests.support.scripted import Answer, Asked, json_error, scripted

#: The wait's bound, with no time to back off (the pauses are recorded, not slept).
FAST_WAIT = RetryPolicy(attempts=7, first_backoff_s=0.001)


def batch(status: str) -> Answer:
    doc = {"id": "batch_1", "status": status, "request_counts": {"total": 2, "completed": 1}}
    return Answer(200, json.dumps(doc).encode(), {"Content-Type": "application/json"})


def test_a_wait_reads_on_through_a_refused_connection_503_and_429() -> None:
    answers = [batch("in_progress"), json_error(503, "backend_unavailable", 0),
               json_error(429, "overloaded", 0), batch("completed")]
    seen: list[str] = []
    pauses: list[float] = []
    with scripted(lambda n, _a: answers[n], listening=False) as server:

        def pause(delay_s: float) -> None:
            pauses.append(delay_s)
            if len(pauses) == 1:  # the web is back after its first refused connection
                server.listen()

        bulk = Bulk(server.url, None, wait_retry=FAST_WAIT)
        try:
            doc = bulk.wait("batch_1", lambda d: seen.append(d["status"]), pause)
        finally:
            bulk.close()
        assert len(server.requests()) == 4
    assert doc["status"] == "completed" and seen == ["in_progress", "completed"]
    assert pauses.count(POLL_S) == 1 and len(pauses) == 4


@pytest.mark.parametrize(("answer", "says"), [
    (json_error(503, "backend_unavailable", 0), "the last: 503 backend_unavailable"),
    (None, "the last: nothing answers at"),
])
def test_a_wait_gives_up_past_its_bound_saying_what_it_saw_last(
        answer: Answer | None, says: str) -> None:
    def always(_n: int, _asked: Asked) -> Answer:
        assert answer is not None
        return answer

    with scripted(always, listening=answer is not None) as server:
        bulk = Bulk(server.url, None, wait_retry=FAST_WAIT)
        pauses: list[float] = []
        with pytest.raises(ClientError, match="gave up after 7 tries") as raised:
            bulk.wait("batch_1", lambda d: None, pauses.append)
        bulk.close()
        assert says in str(raised.value) and len(pauses) == FAST_WAIT.attempts - 1
        assert len(server.requests()) == (FAST_WAIT.attempts if answer else 0)


def test_a_refusal_is_not_retried() -> None:
    with scripted(lambda _n, _a: json_error(404, "not_found")) as server:
        bulk = Bulk(server.url, None, wait_retry=FAST_WAIT)
        with pytest.raises(RequestRejected, match="404 not_found"):
            bulk.wait("batch_1", lambda d: None, lambda _s: None)
        bulk.close()
        assert len(server.requests()) == 1


def test_carpool_batch_status_reads_through_a_503(capsys: pytest.CaptureFixture[str]) -> None:
    answers = [json_error(503, "backend_unavailable", 0), batch("in_progress")]
    with scripted(lambda n, _a: answers[n]) as server:
        assert main(["batch", "status", "batch_1", "--url", server.url]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "in_progress"
