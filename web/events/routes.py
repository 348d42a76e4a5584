"""The event-stream routes: ``GET /result/<id>/events`` and ``GET /events?ids=a,b``
(web/events/streams.py has the stream; docs/events.md the format).

A stream holds one of its client's long-poll slots (web/results/polls.py) for its life, which
is at most ``CARPOOL_MAX_WAIT_S`` (at least a second): gunicorn's gevent worker parks
it as a greenlet, and a graceful stop waits for it as for the longest long-poll.
Its client reconnects with ``Last-Event-ID``. Ids are owner-scoped as reads are: a
job of another API key is the 404 of an unknown one.
"""

from __future__ import annotations

from contextlib import ExitStack

from flask import Blueprint, Response, request

from carpool.core.errors import InvalidInput
from carpool.core.jobs import JobStatus, JobView, is_job_id
from web.common.auth import check_owner, request_owner
from web.common.refusals import JobNotFound
from web.common.state import current_state
from web.events.streams import MAX_STREAM_IDS, JobStream, parse_last_event_id
from web.results.polls import client_gone_check

blueprint = Blueprint("carpool_events", __name__)

#: The shortest life of a stream, whatever CARPOOL_MAX_WAIT_S says (0 turns long-polls
#: off; a stream that ended at once would only make its client reconnect in a loop).
MIN_LIFETIME_S = 1.0
#: Headers of every stream: no cache, and no buffering by a proxy (nginx reads it).
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@blueprint.get("/result/<job_id>/events")
def job_events(job_id: str) -> Response:
    """The job's state changes, and its place while queued, until it is final."""
    if not is_job_id(job_id):  # never a Redis lookup for garbage
        raise JobNotFound(f"no job {job_id[:64]!r}: not a job id")
    return _stream([job_id])


@blueprint.get("/events")
def many_events() -> Response:
    """The events of several jobs in one stream: ``?ids=a,b,...``."""
    return _stream(stream_ids(request.args.get("ids")))


def stream_ids(raw: str | None) -> list[str]:
    """The ids of ``?ids=``, in order; ``InvalidInput`` for none, too many, a repeated
    or a malformed one."""
    if not raw:
        raise InvalidInput("name the jobs to follow: GET /events?ids=<id>,<id>,...")
    ids = raw.split(",", MAX_STREAM_IDS)
    if len(ids) > MAX_STREAM_IDS:
        raise InvalidInput(f"at most {MAX_STREAM_IDS} ids in one stream; open another "
                           "stream for the rest")
    for job_id in ids:
        if not is_job_id(job_id):
            raise InvalidInput(f"{job_id[:64]!r} in ids is not a job id")
    if len(set(ids)) != len(ids):
        raise InvalidInput("an id is listed twice in ids: name each job once")
    return ids


def _stream(ids: list[str]) -> Response:
    state = current_state()
    owner = request_owner(state.settings, request)
    seen = parse_last_event_id(request.headers.get("Last-Event-ID"), len(ids))
    stack = ExitStack()
    try:
        stack.enter_context(state.polls.hold(owner or request.remote_addr or ""))
        stack.enter_context(state.metrics.event_streams.track_inprogress())
        # Registered before the first read: a claim or an end after it wakes the stream.
        follow = stack.enter_context(state.notifier.follow(ids))
        views, ended = _followed(state.reads.get_many(ids), ids, seen, owner)
        stream = JobStream(views, seen, follow, state.reads.get_many, state.notifier.claim_of,
                           client_gone_check(request.environ),
                           max(state.settings.max_wait_s, MIN_LIFETIME_S), ended=ended)
        if not stream.has_news():  # all final, all seen: 204 stops an EventSource
            stack.close()
            return Response(status=204)
        response = Response(stream.events(), mimetype="text/event-stream",
                            headers=STREAM_HEADERS)
        response.call_on_close(stack.close)  # the slot goes when the stream does
        return response
    except BaseException:
        stack.close()
        raise


def _followed(views: list[JobView | None], ids: list[str], seen: list[str | None],
              owner: str) -> tuple[list[JobView], frozenset[str]]:
    """Each job's view, and the ids of those gone since the client saw them (its
    ``Last-Event-ID``): a resumed stream goes on with the others, as it would have had
    they gone mid-stream. An id unknown (or another key's) and never seen is a 404."""
    out: list[JobView] = []
    ended: set[str] = set()
    for view, job_id, told in zip(views, ids, seen, strict=True):
        if view is None and told is not None:
            ended.add(job_id)
            view = JobView(job_id, "", JobStatus.EXPIRED, None, None, None, None, owner)
        out.append(check_owner(view, owner, job_id))
    return out, frozenset(ended)
