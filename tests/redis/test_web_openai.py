"""/v1/files and /v1/batches on real Redis: the shapes, and a 4xx with a message for
every malformed or hostile request (never a 500)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.bulk import embedding_lines
from tests.support.webtools import app_state, web_client, web_settings

KEY, OTHER = "k" * 30, "o" * 30
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path) -> Iterator[FlaskClient]:
    settings = web_settings(redis_url, key_prefix, tmp_path,
                            CARPOOL_FILES_DIR=str(tmp_path / "files"),
                            CARPOOL_API_KEYS=f"{KEY},{OTHER} tier=flex",
                            CARPOOL_BATCH_MAX_FILE_BYTES="65536",
                            CARPOOL_MAX_WAIT_S="1")  # no worker here: embeddings end 504
    with web_client(settings) as c:
        yield c


#: A purpose field, then a file whose filename is not UTF-8.
NOT_UTF8_PARTS = (b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
                  b'--B\r\nContent-Disposition: form-data; name="file"; filename="a\xff"\r\n'
                  b'\r\n{}\n\r\n--B--\r\n')


def upload(http: FlaskClient, data: bytes, purpose: str = "batch",
           headers: dict[str, str] | None = None) -> Any:
    return http.post("/v1/files", headers=AUTH if headers is None else headers,
                     content_type="multipart/form-data",
                     data={"purpose": purpose, "file": (io.BytesIO(data), "in.jsonl")})


def test_a_file_is_stored_listed_read_and_deleted_by_its_key_only(http: FlaskClient) -> None:
    data = embedding_lines(3, model="texts")
    made = upload(http, data)
    assert made.status_code == 200, made.get_json()
    doc = made.get_json()
    assert (doc["object"], doc["bytes"], doc["purpose"], doc["filename"]) == (
        "file", len(data), "batch", "in.jsonl")
    fid = doc["id"]
    assert http.get(f"/v1/files/{fid}/content", headers=AUTH).data == data
    assert [f["id"] for f in http.get("/v1/files", headers=AUTH).get_json()["data"]] == [fid]
    other = {"Authorization": f"Bearer {OTHER}"}
    assert http.get(f"/v1/files/{fid}", headers=other).status_code == 404
    assert http.delete(f"/v1/files/{fid}", headers=other).status_code == 404
    assert http.delete(f"/v1/files/{fid}", headers=AUTH).get_json()["deleted"] is True
    assert http.get(f"/v1/files/{fid}", headers=AUTH).status_code == 404


@pytest.mark.parametrize(("send", "status", "says"), [
    (lambda h: upload(h, b"x", purpose="fine-tune"), 400, "purpose"),
    (lambda h: upload(h, b""), 400, "empty"),
    (lambda h: upload(h, b"x" * 65537), 413, "65536"),  # the file, not its envelope
    (lambda h: upload(h, b"x" * 200_000), 413, "over"),
    (lambda h: h.post("/v1/files", headers=AUTH, json={"file": "x"}), 400, "multipart"),
    (lambda h: h.post("/v1/files", headers=AUTH, content_type="multipart/form-data",
                      data={"purpose": "batch"}), 400, "exactly one file"),
    # werkzeug drops the whole form at a filename that is not UTF-8: not "no purpose".
    (lambda h: h.post("/v1/files", headers=AUTH,
                      content_type="multipart/form-data; boundary=B", data=NOT_UTF8_PARTS),
     400, "no part of the multipart body could be read"),
    (lambda h: h.post("/v1/files", headers=AUTH, content_type="multipart/form-data",
                      data={"purpose": "batch", "file": [(io.BytesIO(b"a"), "a"),
                                                         (io.BytesIO(b"b"), "b")]}),
     400, "exactly one file"),
    (lambda h: upload(h, b"x", headers={}), 401, "API key"),
    (lambda h: h.get("/v1/files/file-nope", headers=AUTH), 404, "no file"),
    (lambda h: h.get("/v1/files/" + "x" * 5000, headers=AUTH), 404, "no file"),
    (lambda h: h.get("/v1/files?limit=0", headers=AUTH), 400, "limit"),
    (lambda h: h.get("/v1/files?limit=" + "9" * 50, headers=AUTH), 400, "limit"),
    (lambda h: h.get("/v1/batches?limit=x", headers=AUTH), 400, "limit"),
    (lambda h: h.get("/v1/batches/batch_nope", headers=AUTH), 404, "no batch"),
    (lambda h: h.post("/v1/batches/batch_nope/cancel", headers=AUTH), 404, "no batch"),
    (lambda h: h.post("/v1/batches", headers=AUTH, data=b"{", content_type="application/json"),
     400, "JSON"),
    (lambda h: h.post("/v1/batches", headers=AUTH, json=[]), 400, "object"),
    (lambda h: h.post("/v1/batches", headers=AUTH, json={"input_file_id": "file-x",
                                                         "endpoint": "/v1/embeddings",
                                                         "completion_window": "24h"}),
     404, "no file"),
    (lambda h: h.post("/v1/batches", headers=AUTH, json={"endpoint": "/v1/chat/completions"}),
     400, "endpoint"),
    (lambda h: h.post("/v1/batches", headers=AUTH, json={"endpoint": "/v1/embeddings",
                                                         "input_file_id": 7}),
     400, "input_file_id"),
    (lambda h: h.post("/v1/embeddings", headers=AUTH, json={"model": "synthetic",
                                                            "input": "a"}), 400, "text"),
    (lambda h: h.post("/v1/embeddings", headers=AUTH, json={"model": "texts", "input": 5}),
     400, "input"),
    (lambda h: h.post("/v1/embeddings", headers=AUTH, json={"model": "texts",
                                                            "input": ["a"] * 3000}),
     400, "at most"),
    (lambda h: h.post("/v1/embeddings", headers=AUTH, json={"model": "nope", "input": "a"}),
     404, "unknown model"),
])
def test_each_bad_request_answers_its_4xx_with_a_message(
        http: FlaskClient, send: Any, status: int, says: str) -> None:
    resp = send(http)
    assert resp.status_code == status, resp.get_json()
    assert says in resp.get_json()["error"]["message"]


@pytest.mark.parametrize(("field", "value", "says"), [
    ("completion_window", "48h", "completion_window"),
    ("completion_window", "0s", "completion_window"),
    ("completion_window", 24, "completion_window"),
    ("completion_window", "1" * 100 + "h", "completion_window"),
    ("completion_window", "24h\n", "completion_window"),  # "$" matches before a "\n"
    ("metadata", {"k": 1}, "metadata"),
    ("metadata", {str(i): "v" for i in range(17)}, "metadata"),
    ("metadata", "x", "metadata"),
    ("extra", 1, "object with"),
])
def test_a_bad_batch_body_answers_400_naming_the_field(
        http: FlaskClient, field: str, value: Any, says: str) -> None:
    fid = upload(http, embedding_lines(1, model="texts")).get_json()["id"]
    body = {"input_file_id": fid, "endpoint": "/v1/embeddings", "completion_window": "24h",
            field: value}
    resp = http.post("/v1/batches", headers=AUTH, json=body)
    assert resp.status_code == 400 and says in resp.get_json()["error"]["message"]


def test_a_batch_is_created_validating_and_cancelled_before_it_runs(http: FlaskClient) -> None:
    fid = upload(http, embedding_lines(1, model="texts")).get_json()["id"]
    made = http.post("/v1/batches", headers=AUTH, json={
        "input_file_id": fid, "endpoint": "/v1/embeddings", "completion_window": "24h",
        "metadata": {"a": "b"}}).get_json()
    assert (made["object"], made["status"], made["metadata"]) == ("batch", "validating",
                                                                  {"a": "b"})
    assert made["expires_at"] - made["created_at"] == 24 * 3600
    assert made["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    cancelled = http.post(f"/v1/batches/{made['id']}/cancel", headers=AUTH).get_json()
    assert cancelled["status"] == "cancelling" and cancelled["cancelling_at"]
    again = http.post(f"/v1/batches/{made['id']}/cancel", headers=AUTH)
    assert again.status_code == 200 and again.get_json()["status"] == "cancelling"


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)
_bodies = st.one_of(_json, st.fixed_dictionaries({}, optional={
    "input_file_id": st.sampled_from(["file-x", ""]) | _json,
    "endpoint": st.sampled_from(["/v1/embeddings", "/submit"]) | _json,
    "completion_window": st.sampled_from(["24h", "1s", "0h"]) | _json,
    "metadata": _json, "model": st.sampled_from(["texts", "synthetic"]) | _json,
    "input": _json, "encoding_format": _json, "dimensions": _json, "webhook": _json,
    "service_tier": st.sampled_from(["flex", "priority", "auto"]) | _json}))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/v1/batches", "/v1/embeddings"]), body=_bodies)
def test_no_json_body_makes_a_500(http: FlaskClient, path: str, body: Any) -> None:
    resp = http.post(path, headers=AUTH, json=body)
    # 200: a valid batch; 504: a valid embeddings request with no worker here.
    assert resp.status_code in (200, 400, 404, 413, 504), (body, resp.get_json())


def test_embeddings_whose_jobs_do_not_end_in_time_answer_504_saying_so(
        http: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    resp = http.post("/v1/embeddings", json={"model": "texts", "input": ["a"]},
                     headers={**AUTH, "X-Carpool-Timeout": "0.05"})
    assert resp.status_code == 504
    assert "CARPOOL_MAX_WAIT_S" in resp.get_json()["error"]["message"]
    # A wait the caller cut short is its answer, not a fault here: no traceback in the
    # log for a client to flood it with.
    assert not [r for r in caplog.records if r.exc_info], caplog.text


@pytest.mark.parametrize("tier, status, says", [
    ("priority", 400, "above this API key's tier 'default'"),
    ("gold", 400, "service_tier must be one of"), ("flex", 504, ""), ("auto", 504, "")])
def test_embeddings_take_openais_service_tier_never_above_the_keys(
        http: FlaskClient, tier: str, status: int, says: str) -> None:
    resp = http.post("/v1/embeddings", headers=AUTH,
                     json={"model": "texts", "input": ["a"], "service_tier": tier})
    assert resp.status_code == status  # 504: admitted, and no worker here runs it
    assert says in resp.get_json()["error"]["message"]


@pytest.mark.parametrize("key, body, headers, status, tier_or_says", [
    (KEY, {}, {}, 200, "default"),  # the key's tier
    (OTHER, {}, {}, 200, "flex"),
    (KEY, {"service_tier": "flex"}, {}, 200, "flex"),
    (KEY, {"service_tier": "auto"}, {"X-Service-Tier": "flex"}, 200, "default"),
    (KEY, {}, {"X-Service-Tier": "flex"}, 200, "flex"),
    (KEY, {"service_tier": "priority"}, {}, 400, "above this API key's tier 'default'"),
    (OTHER, {"service_tier": "default"}, {}, 400, "above this API key's tier 'flex'"),
    (OTHER, {}, {"X-Service-Tier": "priority"}, 400, "above this API key's tier 'flex'"),
    (KEY, {"service_tier": "gold"}, {}, 400, "service_tier must be one of"),
    (KEY, {"service_tier": ["flex"]}, {}, 400, "service_tier must be one of"),
    (KEY, {}, {"X-Service-Tier": "gold"}, 400, "service_tier must be one of"),
])
def test_a_batch_runs_in_its_keys_tier_or_a_lower_one_it_asks_for_never_a_higher(
        http: FlaskClient, key: str, body: dict[str, Any], headers: dict[str, str],
        status: int, tier_or_says: str) -> None:
    auth = {"Authorization": f"Bearer {key}"}
    fid = upload(http, embedding_lines(1, model="texts"), headers=auth).get_json()["id"]
    resp = http.post("/v1/batches", headers={**auth, **headers}, json={
        "input_file_id": fid, "endpoint": "/v1/embeddings", "completion_window": "24h",
        **body})
    assert resp.status_code == status, resp.get_json()
    if status != 200:
        assert tier_or_says in resp.get_json()["error"]["message"]
        assert http.get("/v1/batches", headers=auth).get_json()["data"] == []
        return
    assert resp.get_json()["service_tier"] == tier_or_says
    kept = http.get(f"/v1/batches/{resp.get_json()['id']}", headers=auth).get_json()
    assert kept["service_tier"] == tier_or_says


def test_a_purpose_filter_pages_through_files_of_other_purposes_and_expired_ones(
        http: FlaskClient) -> None:
    """The newest page holds no file of the purpose asked (and one expired): the listing
    reads on, so a page is empty only when nothing more is there to list."""
    state = app_state(http)
    uploaded = [upload(http, embedding_lines(1, model="texts")).get_json()["id"]
                for _ in range(2)]
    owner = state.bulkdb.file(uploaded[0])["owner"]
    for i in range(3):  # newer than both uploads: the feeder's outputs
        state.bulkdb.add_file({"id": f"file-out{i}", "bytes": 1, "created_at": 1,
                               "filename": "out.jsonl", "purpose": "batch_output",
                               "owner": owner}, 60)
    state.bulkdb.client.delete(state.bulkdb.keys.file("file-out2"))  # expired since
    listed = http.get("/v1/files?purpose=batch&limit=2", headers=AUTH).get_json()
    assert [f["id"] for f in listed["data"]] == uploaded[::-1]
    assert listed["has_more"] is False
    outputs = http.get("/v1/files?purpose=batch_output&limit=1", headers=AUTH).get_json()
    assert [f["id"] for f in outputs["data"]] == ["file-out1"] and outputs["has_more"]
    rest = http.get(f"/v1/files?purpose=batch_output&limit=1&after={outputs['last_id']}",
                    headers=AUTH).get_json()
    assert [f["id"] for f in rest["data"]] == ["file-out0"]
