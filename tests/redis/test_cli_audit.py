"""`carpool audit`: the one-place invariant and the dead letters, on a real Redis."""

from __future__ import annotations

import pytest

from carpool.backend.keys import shard
from carpool.backend.queue import Queue
from carpool.cli import main
from tests.conftest import make_env
from tests.support.jobs import admit, synthetic


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str) -> None:
    for name, value in make_env(redis_url, key_prefix).items():
        monkeypatch.setenv(name, value)


def test_audit_passes_a_consistent_queue_and_lists_the_dead_letters(
        env: None, queue: Queue, capsys: pytest.CaptureFixture[str]) -> None:
    admit(queue, synthetic())
    queue.client.lpush(queue.keys.dead(shard("synthetic")), "job-failed-by-the-reaper")
    assert main(["audit"]) == 0
    out = capsys.readouterr().out
    assert "0 jobs not in exactly one place; 1 dead letters shown" in out
    assert "  job-failed-by-the-reaper" in out


def test_audit_names_a_job_in_two_places_and_exits_1(
        env: None, queue: Queue, capsys: pytest.CaptureFixture[str]) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    other = queue.keys.bin(spec.name, spec.bins[1].name)
    queue.client.zadd(other, {job: 0})  # the same job queued in a second bin
    assert main(["audit"]) == 1
    out = capsys.readouterr().out
    assert f"{job}: queued, in 2 bin slots" in out


def test_audit_lists_dead_webhook_deliveries(
        env: None, queue: Queue, capsys: pytest.CaptureFixture[str]) -> None:
    from carpool.backend.outbox import DEAD, Delivery, Outbox
    from carpool.core.webhooks import hook_field

    job = admit(queue, synthetic(), hook=hook_field("https://example.com/h", ("cancelled",)))
    queue.cancel(job, 60)
    outbox = Outbox(queue.client, queue.keys)
    (event,) = outbox.take(shard("synthetic"), 10, 5000).events
    outbox.settle(event, DEAD, Delivery(DEAD, 7, 500, "HTTP 500", event.t_ms))
    assert main(["audit"]) == 0
    out = capsys.readouterr().out
    assert "1 dead webhook deliveries shown" in out
    assert f"  {job} cancelled https://example.com/h attempts=7 last_status=500" in out


def test_audit_names_an_outbox_no_dispatcher_takes_with_how_to_drop_it(
        env: None, queue: Queue, capsys: pytest.CaptureFixture[str]) -> None:
    from carpool.core.webhooks import hook_field

    job = admit(queue, synthetic(), hook=hook_field("https://example.com/h", ("cancelled",)))
    queue.cancel(job, 60)  # a pending event of a catalogued model: counted, not flagged
    gone = queue.keys.outbox("zz")  # a shard of a model since removed from the catalogue
    queue.client.zadd(gone, {"old\tdone\t1\t\thttps://example.com/h": 1})
    assert main(["audit"]) == 0
    out = capsys.readouterr().out
    assert "2 webhook events waiting in 2 outboxes" in out
    assert f"  shard {shard('synthetic')}: 1 events" in out
    assert ("shard zz: 1 events" in out and "no dispatcher takes them" in out
            and f"redis-cli DEL '{gone}'" in out)
