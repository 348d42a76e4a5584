"""Every POST body read before its route runs, within its limits and time: the routes
then read ``request.get_data()`` with no wait of their own."""

from __future__ import annotations

from flask import request

from web.common.bodies import read_body
from web.common.metrics import body_read
from web.common.state import current_state


def read_post_body() -> None:
    """Every POST body is read here, within its limits and time (web/common/bodies.py)."""
    if request.method != "POST":
        return
    state = current_state()
    read_body(state.settings, state.body_limits)  # a refusal is counted by the error handler
    body_read()
