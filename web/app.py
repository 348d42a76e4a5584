"""The app factory: ``gunicorn -c python:web.gunicorn_conf 'web:create_app()'``."""

from __future__ import annotations

from flask import Flask

from carpool.admission.budget import check_catalogue_memory
from carpool.backend.admissions import Admissions
from carpool.backend.bulkdb import BulkDb
from carpool.backend.connection import connect
from carpool.backend.durability import check_durability, read_persistence
from carpool.backend.filestore import file_store
from carpool.backend.keys import Keys
from carpool.backend.need_gauges import NeedGauges, NeedReader
from carpool.backend.queue import Queue
from carpool.backend.registry import Registry, RegistryCache
from carpool.backend.repository import Repository
from carpool.backend.rollouts import RolloutCache, RolloutStore
from carpool.backend.shadows import ShadowBook, ShadowCounters
from carpool.core.catalogue import PYTHON_KIND
from carpool.core.errors import BackendUnavailable
from carpool.core.settings import Settings, load_settings
from carpool.core.versions import version_map
from carpool.intake import custom
from web import server_routes
from web.common import errors, shedding
from web.common.bodies import BodyLimits
from web.common.lean import LeanRoutes
from web.common.metrics import WebMetrics
from web.common.post_body import read_post_body
from web.common.routing import Routing
from web.common.state import EXTENSION, WebState
from web.events import routes as event_routes
from web.jobs import routes as job_routes
from web.open_inference import repository as repository_routes
from web.open_inference import routes as open_inference_routes
from web.openai import bulk as openai_bulk
from web.openai import files as openai_files
from web.results.polls import PollCounter
from web.results.pushed_views import max_age_for
from web.results.reads import ReadBatcher
from web.results.waiters import Notifier
from web.rollouts import routes as rollout_routes

#: Bounds a hung Redis: a request answers 503 after this, instead of hanging.
REDIS_SOCKET_TIMEOUT_S = 5.0
#: Redis connections per web process (one is the long-poll listener's). Requests
#: beyond it wait their turn for a connection: a command takes ~0.2 ms, so 64
#: serve thousands of greenlets, and Redis's client count stays bounded.
REDIS_CONNECTIONS = 64


def create_app(settings: Settings | None = None, *, lean_routes: bool = True) -> Flask:
    """A Flask app with one Queue; ``settings`` default to ``load_settings()``.

    Nothing here touches Redis: the app starts (and answers /healthz) without it.
    ``lean_routes=False`` leaves every route to Flask's dispatch (tests compare the two:
    web/common/lean.py).
    """
    settings = load_settings() if settings is None else settings
    for spec in settings.catalogue:
        if spec.kind == PYTHON_KIND:
            custom.check_schema(spec)  # a broken schema stops the web at start, not per job
    app = Flask(__name__)
    # read_body (web/common/bodies.py) bounds each body by what its route takes; this is
    # Flask's own backstop, so it is the largest of those.
    app.config["MAX_CONTENT_LENGTH"] = BodyLimits(settings).largest
    client = connect(settings.redis_url, socket_timeout_s=REDIS_SOCKET_TIMEOUT_S,
                     cluster=settings.redis_cluster,
                     max_connections=REDIS_CONNECTIONS)
    keys = Keys(settings.key_prefix)
    queue = Queue(client, keys, version_map(settings.catalogue))
    metrics = WebMetrics(queue, settings.catalogue)
    # The scaling rule's gauges, computed at each scrape (never per request).
    metrics.from_redis.collectors.append(NeedGauges(NeedReader(
        client, keys, queue, Registry(client, keys), settings.catalogue,
        settings.cold_start_s)))
    own_models = [s.name for s in settings.catalogue if not s.family]
    shadows = ShadowBook(queue, keys)
    kinds = {m: settings.catalogue.models[m].kind for m in own_models}
    metrics.from_redis.collectors.append(ShadowCounters(shadows, kinds))
    admissions = Admissions(client, keys, coalesce=True, policies=settings.api_key_policies)
    notifier = Notifier(client, keys.done_channel, keys.admitted_channel, keys.results_channel,
                        max_age_for(spec.result_ttl_s for spec in settings.catalogue),
                        claimed_channel=keys.claimed_channel)
    app.extensions[EXTENSION] = WebState(
        settings=settings, queue=queue, notifier=notifier,
        metrics=metrics, reads=ReadBatcher(queue, notifier.pushed_view),
        admissions=admissions,
        models=RegistryCache(Registry(client, keys)),
        polls=PollCounter(settings.max_polls_per_client),
        body_limits=BodyLimits(settings),
        bulkdb=BulkDb(client, keys), files=file_store(settings.bulk),
        repository=Repository(client, keys),
        routing=Routing(settings, RolloutCache(RolloutStore(client, keys), own_models),
                        admissions, shadows),
    )
    metrics.instrument(app)
    # Every body read within its limits and time before any route runs, whichever
    # blueprint's: a route that read its own would wait on a slow client unbounded.
    app.before_request(read_post_body)
    app.register_blueprint(server_routes.blueprint)
    app.register_blueprint(job_routes.blueprint)
    app.register_blueprint(open_inference_routes.blueprint)  # docs/v2.md
    app.register_blueprint(repository_routes.blueprint)  # docs/v2.md#repository-api
    app.register_blueprint(event_routes.blueprint)
    app.register_blueprint(openai_files.blueprint)
    app.register_blueprint(openai_bulk.blueprint)
    app.register_blueprint(rollout_routes.blueprint)  # docs/deployments.md
    errors.register(app, on_refused=metrics.count_refused_request)
    if lean_routes:
        app.wsgi_app = LeanRoutes(  # type: ignore[method-assign]
            app, (*job_routes.LEAN_ROUTES, *open_inference_routes.LEAN_ROUTES,
                  *openai_bulk.LEAN_ROUTES))
    shedding.install(app, settings.web_max_queue_ms, on_shed=metrics.count_shed,
                     on_refused=metrics.time_refusal)
    return app


def check_redis_durability(app: Flask) -> list[str]:
    """Warn about each way this app's Redis may lose jobs or fill up; raise when required.

    Also checks the catalogue's byte budgets against Redis's maxmemory (carpool.admission.budget).
    """
    state = app.extensions[EXTENSION]
    assert isinstance(state, WebState)
    client, require = state.queue.client, state.settings.require_durable
    found = check_durability(client, require=require, who="web")
    try:
        maxmemory = read_persistence(client).maxmemory
    except BackendUnavailable:
        return found  # check_durability has said so
    sizing = check_catalogue_memory(state.settings.catalogue, maxmemory, require=require,
                                    who="web")
    return found + [sizing] if sizing else found
