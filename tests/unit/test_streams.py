"""The event stream's rules (web/events/streams.py) on a fake clock: what is told, when, and
what a resumed stream skips. No Redis: reads and claim notices are handed in."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import replace

import pytest

from carpool.core.errors import BackendUnavailable, InvalidInput
from carpool.core.jobs import JobStatus, JobView
from web.events.streams import JobStream, parse_last_event_id, version, version_char
from web.results.followers import Claimed, Follow, parse_claimed


class Clock:
    def __init__(self) -> None:
        self.now = 1000.25

    def __call__(self) -> float:
        return self.now


class FakeEvent(threading.Event):
    """Waiting moves the fake clock on by the timeout, unless the event is set."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        if self.is_set():
            return True
        self.clock.now += timeout or 0.0
        return False


def view(status: JobStatus = JobStatus.QUEUED, attempts: int = 0,
         position: int | None = 5) -> JobView:
    return JobView("j" * 26, "m", status, {"r": 1} if status is JobStatus.DONE else None,
                   None, None, None, "", attempts=attempts, created_ms=1_700_000_000_000,
                   position=position if status is JobStatus.QUEUED else None)


def parsed(chunks: Sequence[str]) -> list[tuple[str, str, dict[str, object]]]:
    out = []
    for block in "".join(chunks).split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines()
                      if ": " in line and not line.startswith(":"))
        if "event" in fields:
            out.append((fields["id"], fields["event"], json.loads(fields["data"])))
    return out


class Script:
    """Reads answered from a list, one view per read; counts them."""

    def __init__(self, views: list[JobView]) -> None:
        self.views = views
        self.reads = 0

    def __call__(self, ids: list[str]) -> list[JobView | None]:
        self.reads += 1
        return [self.views.pop(0) if len(self.views) > 1 else self.views[0]]


def stream(first: JobView, script: Script, clock: Clock, seen: str | None = None,
           claim: Claimed | None = None, lifetime_s: float = 60.0) -> JobStream:
    return JobStream([first], [seen], Follow(event=FakeEvent(clock)), script,
                     lambda _: claim, None, lifetime_s, clock=clock)


def test_versions_grow_along_a_jobs_life_with_a_retry() -> None:
    life = [view(), view(JobStatus.RUNNING, 1), view(JobStatus.QUEUED, 1),
            view(JobStatus.RUNNING, 2), view(JobStatus.DONE, 2)]
    assert [version(v) for v in life] == [0, 1, 2, 3, 5]
    assert version(view(JobStatus.EXPIRED, 0)) > version(view())  # expired while queued


def test_a_queued_job_is_told_its_falling_place_at_most_once_a_second() -> None:
    clock = Clock()
    script = Script([view(position=4), view(position=4), view(position=2),
                     view(JobStatus.DONE, 1)])
    events = parsed(list(stream(view(position=5), script, clock).events()))
    places = [e[2].get("queue_position") for e in events if e[1] == "queued"]
    assert places == [5, 4, 2] and events[-1][1] == "done"


def test_a_place_is_never_told_twice_within_a_second() -> None:
    clock = Clock()
    s = stream(view(position=5), Script([view(position=4)]), clock)
    first = parsed(list(s._tell(s.jobs[0], view(position=5), clock.now)))
    again = parsed(list(s._tell(s.jobs[0], view(position=4), clock.now)))  # no sooner
    clock.now += 1.0
    later = parsed(list(s._tell(s.jobs[0], view(position=4), clock.now)))
    assert [len(first), len(again), len(later)] == [1, 0, 1]


def test_a_claim_notice_turns_a_queued_job_running_without_a_read() -> None:
    clock = Clock()
    script = Script([view(JobStatus.DONE, 1)])
    s = stream(view(), script, clock, claim=Claimed(1_700_000_000_500, 1))
    chunks = s.events()
    assert parsed([next(chunks)])[0][1] == "queued"
    s.follow.wake("j" * 26)
    running = parsed([next(chunks)])[0]
    assert running[1] == "running" and running[2]["started_at"].endswith(".500Z")
    assert script.reads == 0
    assert running[0] == "1"


def test_a_resumed_stream_skips_the_state_the_client_saw() -> None:
    clock = Clock()
    running = view(JobStatus.RUNNING, 1)
    s = stream(running, Script([view(JobStatus.DONE, 1)]), clock, seen=version_char(running))
    s.follow.wake("j" * 26)
    assert [e[1] for e in parsed(list(s.events()))] == ["done"]


@pytest.mark.parametrize("runs", [1, 17, 18, 40])
def test_each_state_of_a_job_with_many_runs_is_told_and_its_end_once(runs: int) -> None:
    # 18 runs (CARPOOL_MAX_ATTEMPTS=18, or a job handed back with its run counted) once
    # put queued, running and done at the same saturated character: done was never told.
    life = [view(JobStatus.QUEUED, runs - 1), view(JobStatus.RUNNING, runs),
            view(JobStatus.DONE, runs)]
    events = parsed(list(stream(life[0], Script(life[1:]), Clock()).events()))
    assert [e[1] for e in events] == ["queued", "running", "done"]
    resumed = stream(life[1], Script(life[2:]), Clock(), seen=version_char(life[1]))
    resumed.follow.wake("j" * 26)
    assert [e[1] for e in parsed(list(resumed.events()))] == ["done"]
    assert not stream(life[2], Script(life[2:]), Clock(), seen=events[-1][0]).has_news()


def test_a_cancel_after_a_refunded_run_is_told_to_a_client_that_saw_the_run() -> None:
    # Handed back with its attempt refunded (attempts 0 again), then cancelled: version 1,
    # as its run was; a final state has its own character, so it is still told.
    running = view(JobStatus.RUNNING, 1)
    cancelled = view(JobStatus.CANCELLED, 0)
    assert stream(running, Script([cancelled]), Clock(), seen=version_char(running)).has_news()
    s = stream(running, Script([cancelled]), Clock(), seen=version_char(running))
    s.follow.wake("j" * 26)
    assert [e[1] for e in parsed(list(s.events()))] == ["cancelled"]


def test_a_final_job_the_client_saw_has_no_news() -> None:
    done = view(JobStatus.DONE, 1)
    assert not stream(done, Script([done]), Clock(), seen=version_char(done)).has_news()
    assert stream(done, Script([done]), Clock(), seen="1").has_news()


def test_a_stream_ends_at_its_lifetime_while_the_job_waits() -> None:
    clock = Clock()
    start = clock.now
    events = parsed(list(stream(view(), Script([view()]), clock, lifetime_s=5).events()))
    assert [e[1] for e in events] == ["queued"] and clock.now - start == pytest.approx(5, abs=1)


def test_a_deleted_job_ends_its_stream_without_an_event() -> None:
    clock = Clock()
    s = JobStream([view()], [None], Follow(event=FakeEvent(clock)), lambda ids: [None],
                  lambda _: None, None, 60, clock=clock)
    assert [e[1] for e in parsed(list(s.events()))] == ["queued"]


@pytest.mark.parametrize("raw", ["00", "Z", "0 ", "\x00", "0" * 3000, "é"])
def test_a_last_event_id_this_stream_could_not_have_sent_is_refused(raw: str) -> None:
    with pytest.raises(InvalidInput, match="Last-Event-ID"):
        parse_last_event_id(raw, 1)


def test_a_last_event_id_names_each_jobs_version_and_z_none() -> None:
    assert parse_last_event_id("3z0", 3) == ["3", None, "0"]
    assert parse_last_event_id(None, 2) == [None, None]


def test_claimed_messages_parse_and_a_broken_one_is_refused() -> None:
    assert parse_claimed("17 a 1 b 2") == (17, [("a", 1), ("b", 2)])
    with pytest.raises(ValueError):
        parse_claimed("17 a")
    assert replace(view(), position=None).to_json().get("queue_position") is None


def test_events_ready_at_one_wake_up_go_in_one_write() -> None:
    clock = Clock()
    a, b = view(), replace(view(), id="k" * 26)
    done_a, done_b = (replace(v, status=JobStatus.DONE, result={"r": 1}, position=None)
                      for v in (a, b))
    follow = Follow(event=FakeEvent(clock))
    s = JobStream([a, b], [None, None], follow, lambda ids: [done_a, done_b][:len(ids)],
                  lambda _: None, None, 60.0, clock=clock)
    follow.wake(a.id)
    follow.wake(b.id)
    chunks = list(s.events())
    assert len(chunks) == 2  # the start, then both ends together
    assert [e for _, e, _ in parsed(chunks[1:])] == ["done", "done"]
    assert parsed(chunks)[-1][0] == "yy"


def test_an_event_told_before_a_lost_backend_is_sent_before_the_error() -> None:
    clock = Clock()
    a, b = view(), replace(view(), id="k" * 26)

    def lost(ids: list[str]) -> list[JobView | None]:
        raise BackendUnavailable("redis is gone")

    follow = Follow(event=FakeEvent(clock))
    s = JobStream([a, b], [None, None], follow, lost,
                  lambda i: Claimed(1_700_000_000_500, 1) if i == a.id else None, None, 60.0,
                  clock=clock)
    follow.wake(a.id)
    follow.wake(b.id)
    events = parsed(list(s.events()))
    assert [(i, e) for i, e, _ in events] == [("0z", "queued"), ("00", "queued"),
                                              ("10", "running"), ("10", "error")]


def test_a_job_gone_before_the_stream_resumed_is_told_nothing_and_keeps_its_place() -> None:
    clock = Clock()
    gone = replace(view(JobStatus.EXPIRED), id="g" * 26)
    queued = view(position=1)
    s = JobStream([gone, queued], ["3", None], Follow(event=FakeEvent(clock)),
                  lambda ids: [view(JobStatus.DONE, 1) for _ in ids], lambda _: None, None,
                  60.0, clock=clock, ended=frozenset({gone.id}))
    assert s.has_news()
    s.follow.wake(queued.id)
    events = parsed(list(s.events()))
    assert [(e[1], e[2]["id"]) for e in events] == [("queued", queued.id), ("done", queued.id)]
    assert all(e[0][0] == "3" and len(e[0]) == 2 for e in events)  # its char, unchanged
    s = JobStream([gone], ["3"], Follow(event=FakeEvent(clock)), lambda ids: [], lambda _: None,
                  None, 60.0, clock=clock, ended=frozenset({gone.id}))
    assert not s.has_news()  # nothing but it: 204, not a stream with nothing to say
