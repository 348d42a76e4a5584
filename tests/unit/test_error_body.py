"""The JSON error body: OpenAI's error object, its ``type`` by status."""

from __future__ import annotations

import pytest

from web.common.errors import error_body, error_type


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (404, "invalid_request_error"),
    (409, "invalid_request_error"), (413, "invalid_request_error"),
    (401, "authentication_error"), (403, "permission_error"),
    (429, "rate_limit_error"), (500, "server_error"), (503, "server_error"),
    (504, "server_error"),
])
def test_each_status_has_openais_error_type(status: int, kind: str) -> None:
    assert error_type(status) == kind


def test_the_error_object_has_openais_four_fields() -> None:
    assert error_body("bin_full", "full", status=429) == {"error": {
        "code": "bin_full", "message": "full", "type": "rate_limit_error", "param": None}}
