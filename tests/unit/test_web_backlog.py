"""The web's view of its own backlog: the CPU per request on a fake clock, the accept
queue's expected wait by Little's law, and what TCP_INFO reads on loopback sockets."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator

import pytest

from web.common.backlog import (
    CPU_WINDOW_MAX_S,
    CPU_WINDOW_MIN_REQUESTS,
    MIN_LISTEN_QUEUE,
    ListenBacklog,
    ServiceRate,
    data_age_ms,
    listen_queue,
)

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO is Linux's")


class FakeClocks:
    """Wall and CPU time, advanced by hand."""

    def __init__(self) -> None:
        self.now = 50.0
        self.cpu_s = 3.0

    def wall(self) -> float:
        return self.now

    def cpu(self) -> float:
        return self.cpu_s


def serve(meter: ServiceRate, clocks: FakeClocks, per_s: float, cpu_ms: float,
          seconds: float) -> None:
    """Requests at ``per_s`` for ``seconds``, each costing ``cpu_ms`` of CPU."""
    for _ in range(int(per_s * seconds)):
        clocks.now += 1.0 / per_s
        clocks.cpu_s += cpu_ms / 1000.0
        meter.tick()


def test_the_cpu_per_request_is_measured_and_follows_a_change() -> None:
    clocks = FakeClocks()
    meter = ServiceRate(clock=clocks.wall, cpu=clocks.cpu)
    assert meter.cpu_per_request_s() == 0.0  # nothing measured yet
    serve(meter, clocks, per_s=400.0, cpu_ms=1.0, seconds=2.0)
    assert meter.cpu_per_request_s() == pytest.approx(0.001, rel=0.01)
    serve(meter, clocks, per_s=400.0, cpu_ms=0.2, seconds=5.0)
    assert meter.cpu_per_request_s() == pytest.approx(0.0002, rel=0.05)


def test_an_idle_spell_does_not_read_as_costly_requests() -> None:
    clocks = FakeClocks()
    meter = ServiceRate(clock=clocks.wall, cpu=clocks.cpu)
    serve(meter, clocks, per_s=400.0, cpu_ms=1.0, seconds=2.0)
    # Ten seconds with a request now and then, while background work takes CPU: windows
    # too long or too thin to measure.
    for _ in range(10):
        clocks.now += CPU_WINDOW_MAX_S * 1.5
        clocks.cpu_s += 0.05
        meter.tick()
    assert CPU_WINDOW_MIN_REQUESTS > 1
    assert meter.cpu_per_request_s() == pytest.approx(0.001, rel=0.01)
    serve(meter, clocks, per_s=400.0, cpu_ms=1.0, seconds=1.0)  # busy again: measured
    assert meter.cpu_per_request_s() == pytest.approx(0.001, rel=0.01)


def backlog_of(queued: int, cpu_ms: float, processes: int = 1) -> ListenBacklog:
    clocks = FakeClocks()
    meter = ServiceRate(clock=clocks.wall, cpu=clocks.cpu)
    serve(meter, clocks, per_s=300.0, cpu_ms=cpu_ms, seconds=2.0)
    return ListenBacklog(["listener"], processes, meter, read=lambda sock: (queued, 2048))


def test_the_accept_queue_waits_its_length_times_the_cost_over_the_processes() -> None:
    assert backlog_of(600, cpu_ms=2.0).wait_s() == pytest.approx(1.2, rel=0.02)
    assert backlog_of(600, cpu_ms=2.0, processes=2).wait_s() == pytest.approx(0.6, rel=0.02)


def test_a_short_accept_queue_or_an_unmeasured_cost_is_no_backlog() -> None:
    assert backlog_of(MIN_LISTEN_QUEUE - 1, cpu_ms=500.0).wait_s() == 0.0
    cold = ListenBacklog(["listener"], 1, ServiceRate(), read=lambda sock: (500, 2048))
    assert cold.wait_s() == 0.0  # a burst at a web that has served nothing yet


def test_unreadable_listeners_count_nothing() -> None:
    backlog = ListenBacklog(["a", "b"], 1, ServiceRate(), read=lambda sock: None)
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
                      LagMonitor(clock=FakeClocks().wall), shed.append)
    submit = {"REQUEST_METHOD": "POST", "PATH_INFO": "/submit"}
    assert shedder.reason(submit) is None
    shedder.backlog = backlog_of(600, cpu_ms=2.0)  # 1.2 s of work ahead of a newcomer
    assert shedder.reason(submit) == REASON_LISTEN_BACKLOG
    assert shedder.reason({"REQUEST_METHOD": "GET", "PATH_INFO": "/result/x"}) is None
    status: list[str] = []
    assert list(shedder(submit, lambda s, headers: status.append(s))) != [b"served"]
    assert status == ["503 Service Unavailable"] and shed == [REASON_LISTEN_BACKLOG]
    shedder.backlog = backlog_of(100, cpu_ms=2.0)  # 0.2 s: within the bound
    assert shedder.reason(submit) is None
