"""The web's view of its own backlog: the request rate on a fake clock, the accept
queue's expected wait by Little's law, and what TCP_INFO reads on loopback sockets."""

from __future__ import annotations

import math
import socket
import sys
from collections.abc import Iterator

import pytest

from web.common.backlog import (
    MIN_LISTEN_QUEUE,
    ListenBacklog,
    RateMeter,
    data_age_ms,
    listen_queue,
)

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO is Linux's")


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def steady(meter: RateMeter, clock: FakeClock, per_s: float, seconds: float) -> None:
    for _ in range(int(per_s * seconds)):
        clock.now += 1.0 / per_s
        meter.tick()


def test_the_rate_meter_reads_a_steady_rate_and_forgets_it_when_idle() -> None:
    clock = FakeClock()
    meter = RateMeter(half_life_s=0.5, clock=clock)
    assert meter.per_s() == 0.0
    steady(meter, clock, per_s=400.0, seconds=5.0)
    assert meter.per_s() == pytest.approx(400.0, rel=0.01)
    clock.now += 0.5  # one half-life without a request
    assert meter.per_s() == pytest.approx(200.0, rel=0.01)
    clock.now += 10.0
    assert meter.per_s() < 1.0


def test_the_rate_meter_follows_a_change_of_speed_within_a_few_half_lives() -> None:
    clock = FakeClock()
    meter = RateMeter(half_life_s=0.5, clock=clock)
    steady(meter, clock, per_s=1000.0, seconds=5.0)
    steady(meter, clock, per_s=100.0, seconds=5.0)  # ten half-lives
    assert meter.per_s() == pytest.approx(100.0, rel=0.05)


def backlog_of(queued: int, per_s: float, processes: int = 1) -> ListenBacklog:
    clock = FakeClock()
    meter = RateMeter(half_life_s=0.5, clock=clock)
    steady(meter, clock, per_s=per_s, seconds=5.0)
    return ListenBacklog(["listener"], processes, meter, read=lambda sock: (queued, 2048))


def test_the_accept_queue_waits_its_length_over_the_rate_of_every_process() -> None:
    assert backlog_of(600, per_s=300.0).wait_s() == pytest.approx(2.0, rel=0.02)
    assert backlog_of(600, per_s=300.0, processes=2).wait_s() == pytest.approx(1.0, rel=0.02)


def test_a_short_accept_queue_is_no_backlog_however_slow_the_web_was() -> None:
    assert backlog_of(MIN_LISTEN_QUEUE - 1, per_s=0.5).wait_s() == 0.0
    idle = ListenBacklog(["listener"], 1, RateMeter(clock=FakeClock()),
                         read=lambda sock: (MIN_LISTEN_QUEUE, 2048))
    assert idle.wait_s() == math.inf  # queued connections and nothing taken: no end


def test_unreadable_listeners_count_nothing() -> None:
    backlog = ListenBacklog(["a", "b"], 1, RateMeter(), read=lambda sock: None)
    assert backlog.queued() == 0 and backlog.wait_s() == 0.0
    assert data_age_ms(None) is None and listen_queue(object()) is None


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock


@linux
def test_tcp_info_reads_the_accept_queue_and_its_limit(listener: socket.socket) -> None:
    assert listen_queue(listener) == (0, 64)
    clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
    try:
        assert listen_queue(listener) == (3, 64)  # the handshake ends before connect returns
        listener.accept()[0].close()
        assert listen_queue(listener) == (2, 64)
    finally:
        for client in clients:
            client.close()


@linux
def test_tcp_info_reads_how_long_ago_a_connections_bytes_arrived(
        listener: socket.socket) -> None:
    with socket.create_connection(listener.getsockname()) as client:
        client.sendall(b"GET / HTTP/1.1\r\n\r\n")
        accepted, _ = listener.accept()
        with accepted:
            accepted.recv(100)
            first = data_age_ms(accepted)
            assert first is not None and 0 <= first < 60_000
            later = data_age_ms(accepted)
            assert later is not None and later >= first  # it only grows until new bytes


def test_the_shedder_answers_503_while_the_accept_queue_outlasts_the_bound() -> None:
    from web.common.shedding import REASON_LISTEN_BACKLOG, LagMonitor, Shedder

    shed: list[str] = []
    shedder = Shedder(lambda environ, start: [b"served"], 300,
                      LagMonitor(clock=FakeClock()), shed.append)
    submit = {"REQUEST_METHOD": "POST", "PATH_INFO": "/submit"}
    assert shedder.reason(submit) is None
    shedder.backlog = backlog_of(600, per_s=300.0)  # 2 s of work ahead of a newcomer
    assert shedder.reason(submit) == REASON_LISTEN_BACKLOG
    assert shedder.reason({"REQUEST_METHOD": "GET", "PATH_INFO": "/result/x"}) is None
    status: list[str] = []
    assert list(shedder(submit, lambda s, headers: status.append(s))) != [b"served"]
    assert status == ["503 Service Unavailable"] and shed == [REASON_LISTEN_BACKLOG]
    shedder.backlog = backlog_of(100, per_s=600.0)  # 0.17 s: within the bound
    assert shedder.reason(submit) is None
