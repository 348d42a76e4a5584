"""The hot routes, answered in front of Flask's dispatch by the same view code.

Flask's dispatch (a request context with its URL adapter and session, the hooks and
signals, a Response object) costs a request more CPU than gunicorn's own parsing and
gevent's sockets together (``ops/bench/web_floor.py``; docs/benchmarks.md). Every job
takes one of a few routes, so those are answered here, by ``LeanRoutes`` mounted as the
app's WSGI app: ``POST /submit`` with a JSON body, ``GET /result/<id>``
(web/jobs/routes.py), ``/v2`` infer (web/open_inference/routes.py) and
``/v1/embeddings`` (web/openai/bulk.py). Everything else
goes on to Flask: another route or method (HEAD, OPTIONS), a submit of another content
type (a form, an image), a path that is not ASCII, a WebSocket upgrade.

A lean route's view is the one its Flask route calls: it takes the request as an
argument (``flask.Request``, made here from the environ without a request context) and
answers an ``Answer``; ``flask_answer`` makes Flask's response of it. What Flask does
around a view, done here the same way:

- an app context per request (``current_app``, ``g``);
- a request body read within its limits before the view (web/common/post_body.py);
- every error answered by the handler Flask would pick (the app's, or the route's
  blueprint's: ``LeanRoute.errors``), a refusal counted first as it counts it; a
  failure there answered as Flask answers one, by the handler for a 500;
- each answer counted in ``carpool_http_requests_total`` under the Flask route's rule;
- the JSON written as ``jsonify`` writes it (the app's provider, compact, a newline).

Hooks and signals are not run: at mount, the app may hold none but those done here
(``read_post_body``, the metrics' clock and count), else it does not start: a hook
added later must be done here too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flask import (
    Flask,
    Request,
    Response,
    current_app,
    got_request_exception,
    request_finished,
    request_started,
    request_tearing_down,
)
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import InternalServerError
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.routing import Rule

from web.common.errors import handled
from web.common.post_body import read_post_body
from web.common.state import current_state

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


@dataclass(frozen=True)
class Answer:
    """A view's answer: its JSON document, status and headers beside Content-Type.

    With ``binary``, the body is the JSON document followed by those bytes, sent as
    ``application/octet-stream`` with the JSON's length in the ``binary_header``
    (the Open Inference Protocol's binary tensors, docs/v2.md)."""

    doc: dict[str, Any]
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    binary: bytes = b""
    binary_header: str = ""

    def __post_init__(self) -> None:
        if self.binary and not self.binary_header:
            raise ValueError("binary bytes need the header that gives the JSON's length")

    def body_and_headers(self) -> tuple[bytes, list[tuple[str, str]]]:
        """The body's bytes, and every header but the status line's. Needs an app context."""
        # What jsonify writes outside debug mode: the app's JSON provider, compact.
        body = f"{current_app.json.dumps(self.doc, separators=(',', ':'))}\n".encode()
        kind = "application/json"
        extra = list(self.headers.items())
        if self.binary:
            kind = "application/octet-stream"
            extra.append((self.binary_header, str(len(body))))
            body += self.binary
        return body, [("Content-Type", kind), ("Content-Length", str(len(body))), *extra]


def flask_answer(answer: Answer) -> Response:
    """``answer`` as a Flask view returns it."""
    body, headers = answer.body_and_headers()
    return Response(body, answer.status, headers)


def app_error_answer(exc: Exception, req: Request) -> tuple[Response, int]:
    """What the app's error handler answers (web/common/errors.py)."""
    return handled(exc, req, current_state().metrics.count_refused_request)


#: A lean view: the request, and the path's arguments by name (as Flask passes them).
LeanView = Callable[..., Answer]


@dataclass(frozen=True)
class LeanRoute:
    """One route answered here: ``path`` as Flask writes it, each ``<name>`` one path
    segment (Flask's default converter), its argument by that name."""

    method: str
    path: str
    #: The Flask endpoint of the same route: its rule labels the metrics, and a submit
    #: endpoint's refusals count as rejected jobs.
    endpoint: str
    view: LeanView
    #: Only requests of this mimetype ("": any); others go to Flask.
    mimetype: str = ""
    #: The answer to an error the view raised: what Flask's handler for it answers (the
    #: app's, or the route's blueprint's own), a refusal counted as that handler counts it.
    errors: Callable[[Exception, Request], ResponseReturnValue] = app_error_answer

    @property
    def segments(self) -> list[str]:
        return self.path.split("/")

    def __post_init__(self) -> None:
        for part in self.segments:
            if part.startswith("<") and (":" in part or not part.endswith(">")):
                raise ValueError(f"{self.path}: a lean route's arguments are plain <name> "
                                 "segments, without a converter")


def _arguments(pattern: list[str], parts: list[str]) -> dict[str, str] | None:
    """The arguments of ``parts`` (a path split at "/") under ``pattern``, or None."""
    args: dict[str, str] = {}
    for want, got in zip(pattern, parts, strict=True):
        if want.startswith("<"):
            if not got:
                return None
            args[want[1:-1]] = got
        elif want != got:
            return None
    return args


class LeanRoutes:
    """The app's WSGI app: ``routes`` answered here, the rest by Flask (``app.wsgi_app``
    as it was when mounted)."""

    def __init__(self, app: Flask, routes: Iterable[LeanRoute]) -> None:
        self.app = app
        self.flask: WsgiApp = app.wsgi_app
        rules = {(rule.endpoint, rule.rule): rule for rule in app.url_map.iter_rules()}
        #: By method and number of path segments: the few routes a path may be.
        self._routes: dict[tuple[str, int], list[tuple[LeanRoute, list[str], Rule]]] = {}
        routes = tuple(routes)
        for route in routes:
            # A KeyError at start: not one of Flask's routes (its endpoint and rule).
            rule = rules[(route.endpoint, route.path)]
            self._routes.setdefault((route.method, len(route.segments)), []).append(
                (route, route.segments, rule))
        _check_hooks(app, {None, *(r.endpoint.rpartition(".")[0] for r in routes)})

    def __call__(self, environ: dict[str, Any], start_response: StartResponse
                 ) -> Iterable[bytes]:
        found = self._match(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""))
        # An upgrade (a WebSocket's) is Flask's to refuse: no rule here takes one.
        if found is None or "HTTP_UPGRADE" in environ:
            return self.flask(environ, start_response)
        route, rule, args = found
        req = self.app.request_class(environ)
        if route.mimetype and req.mimetype != route.mimetype:
            return self.flask(environ, start_response)
        req.url_rule, req.view_args = rule, args
        with self.app.app_context():
            return self._answer(route, rule, req, args, start_response)

    def _match(self, method: str, path: str
               ) -> tuple[LeanRoute, Rule, dict[str, str]] | None:
        # A path that is not ASCII: Flask decodes it (WSGI hands it over as latin-1).
        if not path.isascii():
            return None
        parts = path.split("/")
        for route, pattern, rule in self._routes.get((method, len(parts)), ()):
            args = _arguments(pattern, parts)
            if args is not None:
                return route, rule, args
        return None

    def _answer(self, route: LeanRoute, rule: Rule, req: Request, args: dict[str, str],
                start_response: StartResponse) -> Iterable[bytes]:
        metrics = current_state().metrics
        t0 = time.perf_counter()
        try:
            read_post_body(req)
            answer = route.view(req, **args)
            body, headers = answer.body_and_headers()
        except Exception as exc:  # noqa: BLE001 — answered as Flask's handler answers it
            response = self._error(route, req, exc)
            metrics.observe_request(rule.rule, req.method, response.status_code,
                                    time.perf_counter() - t0)
            return response(req.environ, start_response)
        status = answer.status
        start_response(f"{status} {HTTP_STATUS_CODES.get(status, 'UNKNOWN').upper()}",
                       headers)
        metrics.observe_request(rule.rule, req.method, status, time.perf_counter() - t0)
        return [body]

    def _error(self, route: LeanRoute, req: Request, exc: Exception) -> Response:
        """The route's handler's answer to ``exc``; should the handler itself fail, the
        answer to a 500, as Flask gives it (``Flask.handle_exception``)."""
        try:
            return self.app.make_response(route.errors(exc, req))
        except Exception as failed:  # noqa: BLE001 — as Flask: logged, answered 500
            log.exception("error handler failed on %s %s", req.method, req.path,
                          exc_info=failed)
            server_error = InternalServerError(original_exception=failed)
            return self.app.make_response(route.errors(server_error, req))


#: The hooks the lean routes do themselves, by the attribute that names each.
_DONE_HERE = {"before_request_funcs": ("read_post_body", "start_clock"),
              "after_request_funcs": ("count",)}


def _check_hooks(app: Flask, scopes: set[str | None]) -> None:
    """Raise when ``app`` holds a hook (of the app, or of one of the lean routes'
    blueprints: ``scopes``) or a signal receiver the lean routes would skip."""
    for registry in ("before_request_funcs", "after_request_funcs", "teardown_request_funcs",
                     "url_value_preprocessors"):
        allowed = _DONE_HERE.get(registry, ())
        for scope, funcs in getattr(app, registry).items():
            for func in funcs if scope in scopes else ():
                if getattr(func, "__name__", "") not in allowed:
                    raise RuntimeError(
                        f"{registry} of {scope or 'the app'} holds {func!r}, which the lean "
                        "routes would skip: do its work in web/common/lean.py too")
    for signal in (request_started, request_finished, request_tearing_down,
                   got_request_exception):
        if signal.receivers:
            raise RuntimeError(f"Flask's {signal.name} signal has receivers, which the "
                               "lean routes would skip: do their work in web/common/lean.py")
