"""The web tier: a Flask app that admits jobs and serves results. Never imports torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flask import Flask

    from carpool.core.settings import Settings


def create_app(settings: Settings | None = None, *, lean_routes: bool = True) -> Flask:
    """The app; see ``web.app.create_app``."""
    # Imported on call, not with the package: gunicorn's master imports this
    # package for web.gunicorn_conf, and a gevent worker must monkey-patch
    # before redis and Flask are imported (else gevent warns, and redis keeps
    # unpatched references).
    from web.app import create_app as build

    return build(settings, lean_routes=lean_routes)


__all__ = ["create_app"]
