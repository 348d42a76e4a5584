"""Real gunicorn: a hot route asked with a method it does not take answers 405 with
``Allow``, whether the lean router (web/common/lean.py) or Flask answers it, and a /v2
route too, in front of that blueprint's catch-all for unknown paths."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from carpool.core.jobs import new_job_id
from tests.conftest import REDIS_URL, make_env
from tests.support.procs import start_web

JOB_ID = new_job_id("synthetic")
#: Each hot route (and a /v2 route beside infer), with the methods it takes.
ROUTES = [
    ("/submit", {"POST"}),
    ("/submit/batch", {"POST"}),
    (f"/result/{JOB_ID}", {"GET", "HEAD", "DELETE"}),
    ("/v1/embeddings", {"POST"}),
    ("/v2/models/synthetic/infer", {"POST"}),
    ("/v2/models/synthetic/versions/1/infer", {"POST"}),
    ("/v2/models/synthetic", {"GET", "HEAD"}),
]
OTHER_METHODS = ("GET", "PATCH", "PUT", "DELETE", "POST")


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    prefix = f"test-methods-{new_job_id('x')[:8]}"
    with start_web(make_env(REDIS_URL, prefix)) as url:
        yield url


@pytest.mark.parametrize(("path", "takes"), ROUTES, ids=[p for p, _ in ROUTES])
def test_a_method_a_route_does_not_take_is_405_with_allow(
        base: str, path: str, takes: set[str]) -> None:
    for method in OTHER_METHODS:
        if method in takes:
            continue
        answer = httpx.request(method, base + path, timeout=10)
        assert answer.status_code == 405, (method, path, answer.text)
        allowed = {m.strip() for m in answer.headers.get("Allow", "").split(",")}
        assert allowed - {"OPTIONS"} == takes, (method, path, answer.headers)
        assert "error" in answer.json()


def test_an_unknown_v2_path_is_still_404(base: str) -> None:
    for method in OTHER_METHODS:
        answer = httpx.request(method, base + "/v2/models/synthetic/nope", timeout=10)
        assert answer.status_code == 404, (method, answer.text)
        assert "Allow" not in answer.headers
