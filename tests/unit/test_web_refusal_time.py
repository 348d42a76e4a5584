"""The time of every refusal at the web, on a fake clock: a shed, or a 429 or 503 from
the app, from when the request began to wait; never a served request, never a read."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from web.common.shedding import ADMITTED_ENVIRON, REASON_LAG, LagMonitor, Shedder

SUBMIT = {"REQUEST_METHOD": "POST", "PATH_INFO": "/submit"}
READ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/result/x"}
BOUND_MS = 300


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def answering(status: str, clock: Clock, takes_s: float) -> Any:
    """An app that takes ``takes_s`` to answer ``status``."""
    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        clock.now += takes_s
        start_response(status, [("Content-Type", "application/json")])
        return [b"{}"]
    return app


def shedder_on(clock: Clock, app: Any) -> tuple[Shedder, list[str], list[float]]:
    shed: list[str] = []
    refused: list[float] = []
    return (Shedder(app, BOUND_MS, LagMonitor(clock=clock), shed.append, refused.append,
                    clock=clock), shed, refused)


def lagging(shedder: Shedder, clock: Clock, lag_s: float) -> None:
    """The event loop woke ``lag_s`` late just now: every request waited that long."""
    monitor = shedder.monitor
    monitor.woke(slept_at=clock.now - monitor.interval_s - lag_s, now=clock.now)


@pytest.mark.parametrize("status, refused", [
    ("202 Accepted", False), ("200 OK", False), ("400 Bad Request", False),
    ("429 Too Many Requests", True), ("503 Service Unavailable", True)])
def test_a_refusal_of_an_admitting_request_is_timed_and_nothing_else(status: str,
                                                                     refused: bool) -> None:
    clock = Clock()
    shedder, shed, times = shedder_on(clock, answering(status, clock, 0.004))
    lagging(shedder, clock, 0.002)  # waited 2 ms, then the app took 4 ms
    statuses: list[str] = []
    list(shedder(dict(SUBMIT), lambda s, h, e=None: statuses.append(s)))
    assert statuses == [status] and shed == []
    assert times == ([pytest.approx(0.006)] if refused else [])
    list(shedder(dict(READ), lambda s, h, e=None: statuses.append(s)))
    assert len(times) == int(refused)  # a read admits nothing: its status is no refusal


def test_a_shed_is_timed_as_a_refusal_from_when_its_wait_began() -> None:
    clock = Clock()
    shedder, shed, times = shedder_on(clock, answering("202 Accepted", clock, 0.004))
    lagging(shedder, clock, 0.5)
    statuses: list[str] = []
    list(shedder(dict(SUBMIT), lambda s, h, e=None: statuses.append(s)))
    assert statuses == ["503 Service Unavailable"] and shed == [REASON_LAG]
    assert times == [pytest.approx(0.5)]


def test_with_shedding_off_refusals_are_still_timed() -> None:
    clock = Clock()
    app = answering("429 Too Many Requests", clock, 0.001)
    refused: list[float] = []
    shedder = Shedder(app, 0, LagMonitor(clock=clock), print, refused.append, clock=clock)
    list(shedder(dict(SUBMIT), lambda s, h, e=None: None))
    assert refused == [pytest.approx(0.001)]


def test_an_answer_after_admission_is_no_refusal() -> None:
    """A 503 while an admitted job's caller waits (Redis lost, say) refuses no job."""
    clock = Clock()

    def admits_then_fails(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        environ[ADMITTED_ENVIRON] = True
        return answering("503 Service Unavailable", clock, 2.0)(environ, start_response)

    shedder, _, times = shedder_on(clock, admits_then_fails)
    list(shedder(dict(SUBMIT), lambda s, h, e=None: None))
    assert times == []
