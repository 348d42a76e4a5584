"""The HTTP load driver against a stub server: every result is checked, every fate counted.

The stub (carpool.bench.stub) answers the job API at once. Here it also runs
in a thread of the test with its answers tampered with, to show that the
driver catches a misrouted result, a lost job and a rejection.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from carpool.bench import stub
from carpool.bench.arrivals import poisson_times, with_sizes
from carpool.bench.ceiling import stub_server
from carpool.bench.client import HttpOptions, run_http
from carpool.bench.records import JobRecord, Outcome, Verdict
from carpool.bench.workload import SizeMix
from tests.support.procs import free_port, wait_until

Responder = Callable[[str, str, bytes], bytes]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def tampered_stub(monkeypatch: pytest.MonkeyPatch, tamper: Responder) -> Iterator[str]:
    """The stub in a thread of this process, answering through ``tamper``."""
    monkeypatch.setattr(stub, "respond", tamper)
    port = free_port()
    loop = asyncio.new_event_loop()
    task = loop.create_task(stub.serve(port))

    def run() -> None:
        try:
            loop.run_until_complete(task)
        except asyncio.CancelledError:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_until(lambda: _listening(port), 10.0, "the stub to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(10.0)
        loop.close()


def _drive(url: str, n_per_s: float = 200, seconds: float = 1.0) -> list[JobRecord]:
    arrivals = with_sizes(poisson_times(n_per_s, seconds, seed=11), SizeMix.parse("16"), 11)
    ticks: list[int] = []
    records = run_http(arrivals, HttpOptions(url, grace_s=10.0), "testrun",
                       lambda: ticks.append(1))
    assert len(records) == len(arrivals) == len(ticks)
    assert [r.seq for r in records] == list(range(len(arrivals)))
    return records


def _count(records: list[JobRecord], outcome: Outcome) -> int:
    return sum(1 for r in records if r.outcome is outcome)


def test_every_job_of_a_clean_run_is_ok_and_carries_its_batch() -> None:
    with stub_server() as url:
        records = _drive(url)
    assert _count(records, Outcome.OK) == len(records)
    assert all(r.job_id and r.batch_size == 1 and r.e2e_ms is not None for r in records)


def test_a_result_with_another_jobs_echo_is_counted_as_misrouted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    honest, calls = stub.respond, itertools.count()

    def swap_every_third(method: str, path: str, body: bytes) -> bytes:
        answer = honest(method, path, body)
        if not path.startswith("/result/") or next(calls) % 3:
            return answer
        head, _, payload = answer.partition(b"\r\n\r\n")
        data = json.loads(payload)
        data["result"]["echo"] = {"run": "someone else", "seq": -1}
        raw = json.dumps(data).encode()
        head = head.replace(f"Content-Length: {len(payload)}".encode(),
                            f"Content-Length: {len(raw)}".encode())
        return head + b"\r\n\r\n" + raw

    with tampered_stub(monkeypatch, swap_every_third) as url:
        records = _drive(url)
    misrouted = _count(records, Outcome.MISROUTED)
    assert misrouted == (len(records) + 2) // 3
    assert _count(records, Outcome.OK) == len(records) - misrouted


def test_an_accepted_job_whose_id_is_unknown_is_counted_as_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    honest, calls = stub.respond, itertools.count()

    def forget_every_fourth(method: str, path: str, body: bytes) -> bytes:
        if path.startswith("/result/") and next(calls) % 4 == 0:
            return honest("GET", "/result/nobody", b"")  # the stub's own 404
        return honest(method, path, body)

    with tampered_stub(monkeypatch, forget_every_fourth) as url:
        records = _drive(url)
    lost = [r for r in records if r.outcome is Outcome.LOST]
    assert len(lost) == (len(records) + 3) // 4
    assert all(r.job_id and r.e2e_ms is None for r in lost)


def test_a_full_bin_is_counted_as_rejected_not_as_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    honest, calls = stub.respond, itertools.count()
    full = (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 2\r\n\r\n{}")

    def refuse_every_fifth(method: str, path: str, body: bytes) -> bytes:
        if path == "/submit" and next(calls) % 5 == 0:
            return full
        return honest(method, path, body)

    with tampered_stub(monkeypatch, refuse_every_fifth) as url:
        records = _drive(url)
    rejected = _count(records, Outcome.REJECTED)
    assert rejected == (len(records) + 4) // 5
    assert _count(records, Outcome.OK) == len(records) - rejected
    assert _count(records, Outcome.ERROR) == 0


def test_a_client_that_gives_up_counts_its_job_as_a_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    honest = stub.respond
    never_final = (b"HTTP/1.1 200 OK\r\nContent-Length: 47\r\n\r\n"
                   b'{"id": "x", "status": "queued", "model": "s"} ')

    def stall_some(method: str, path: str, body: bytes) -> bytes:
        if path.startswith("/result/") and int(path[len("/result/stub"):].partition("?")[0]) % 3:
            return never_final  # two jobs in three stay queued
        return honest(method, path, body)

    arrivals = with_sizes(poisson_times(50, 0.5, seed=3), SizeMix.parse("16"), 3)
    with tampered_stub(monkeypatch, stall_some) as url:
        records = run_http(arrivals, HttpOptions(url, grace_s=30.0, client_timeout_s=0.3),
                           "timeouts")
    timeouts = [r for r in records if r.outcome is Outcome.TIMEOUT]
    assert timeouts and len(timeouts) + _count(records, Outcome.OK) == len(records)
    assert _count(records, Outcome.LOST) == 0
    assert all(r.e2e_ms is not None and r.e2e_ms >= 300 for r in timeouts)


def test_a_run_sends_the_job_input_hooks_inputs_and_judges_them_with_its_verify(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    honest = stub.respond
    sent: list[dict[str, object]] = []

    def record_inputs(method: str, path: str, body: bytes) -> bytes:
        if path == "/submit":
            sent.append(json.loads(body)["input"])
        return honest(method, path, body)

    def judge(job_id: str, job_input: dict[str, Any], body: dict[str, Any]) -> Verdict:
        # A real model's answer is no echo: here every other job is judged wrong.
        return Verdict(Outcome.OK if job_input["value"]["n"] % 2 else Outcome.MISROUTED)

    arrivals = with_sizes(poisson_times(100, 0.5, seed=3), SizeMix.parse("16"), 3)
    with tampered_stub(monkeypatch, record_inputs) as stub_url:
        opts = HttpOptions(stub_url, grace_s=10.0,
                           job_input=lambda _nonce, seq, a: {"value": {"n": seq}, "size": a.size},
                           verify=judge)
        records = run_http(arrivals, opts, "hooks")
    assert sorted(x["value"]["n"] for x in sent) == list(range(len(arrivals)))  # type: ignore[index]
    assert [r.outcome for r in records] == [
        Outcome.OK if r.seq % 2 else Outcome.MISROUTED for r in records]


def test_a_job_whose_client_gave_up_after_its_admission_keeps_its_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    honest = stub.respond

    def never_done(method: str, path: str, body: bytes) -> bytes:
        if path.startswith("/result/"):  # still queued, every time it is asked
            job_id = path[len("/result/"):].partition("?")[0]
            return stub._answer(200, {"id": job_id, "status": "queued"})
        return honest(method, path, body)

    arrivals = with_sizes(poisson_times(50, 0.2, seed=5), SizeMix.parse("16"), 5)
    with tampered_stub(monkeypatch, never_done) as url:
        records = run_http(arrivals, HttpOptions(url, client_timeout_s=0.3, grace_s=5.0,
                                                 poll_wait_s=0.1), "gave-up")
    assert records and all(r.outcome is Outcome.TIMEOUT for r in records)
    assert all(r.job_id.startswith("stub") for r in records)
