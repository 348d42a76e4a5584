"""Every request body (POST, PUT, PATCH) read before its route runs, within its limits
and time: the routes then read ``request.get_data()`` with no wait of their own."""

from __future__ import annotations

from flask import Request, request

from carpool.core.errors import UnsupportedMediaType
from web.common.bodies import read_body
from web.common.metrics import body_read
from web.common.state import current_state

#: The methods whose body is read: those HTTP gives a body a meaning in. A DELETE's
#: or GET's body is never read: gunicorn drops it as it drops the rest of a refused one
#: (web/common/bodies.py).
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def read_post_body(req: Request = request) -> None:
    """Every body is read here, within its limits and time (web/common/bodies.py): the
    app runs this before any route of any blueprint (web/app.py; a refusal is counted
    by the error handler), and the lean routes before theirs (web/common/lean.py)."""
    if req.method not in BODY_METHODS:
        return
    if req.headers.get("Content-Encoding", "identity") != "identity":
        raise UnsupportedMediaType("a compressed request body (Content-Encoding) is not "
                                   "accepted: send it uncompressed")
    state = current_state()
    read_body(state.settings, state.body_limits, req)
    body_read()
