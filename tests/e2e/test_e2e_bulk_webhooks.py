"""Batch webhooks end to end: real gunicorn, a Celery worker, the feeder, the dispatcher
and a receiver on loopback, driven by the unmodified openai SDK (the webhook passed with
``extra_body``). A batch's end arrives once per webhook-id, signed the Standard Webhooks
way, in OpenAI's event shape; a refused URL is a 400 at create."""

from __future__ import annotations

import io
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest
from standardwebhooks import Webhook

from carpool.backend.connection import connect
from carpool.backend.keys import BULK_HOOK_TAG, Keys
from carpool.backend.outbox import Outbox
from carpool.stack.waiting import wait_until
from tests.conftest import REDIS_URL, make_env
from tests.support.bulk import CATALOGUE_TOML, embedding_lines, start_feeder, wait_batch
from tests.support.hookstack import (
    API_KEYS,
    DEPLOY_SECRET,
    KEY_OWN,
    KEY_SECRET,
    KEY_SHARED,
    body_of,
)
from tests.support.procs import start_dispatcher, start_web, start_worker
from tests.support.receiver import Receiver, receiver

pytestmark = pytest.mark.e2e

ARRIVAL_TIMEOUT_S = 60.0


@dataclass
class Stack:
    clients: dict[str, openai.OpenAI]
    rx: Receiver
    outbox: Outbox


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("batch-hooks")
    (tmp / "catalogue.toml").write_text(CATALOGUE_TOML)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(tmp / "catalogue.toml"),
                   CARPOOL_FILES_DIR=str(tmp / "files"), CARPOOL_SYNTHETIC_COST_MS="1,0.01",
                   CARPOOL_API_KEYS=API_KEYS, CARPOOL_WEBHOOK_SECRET=DEPLOY_SECRET,
                   CARPOOL_WEBHOOK_ALLOW_PRIVATE="1", CARPOOL_WEBHOOK_RETRY_BASE_S="0.2",
                   CARPOOL_WEBHOOK_RETRY_MAX_S="1")
    redis_client = connect(REDIS_URL)
    try:
        with receiver() as rx, start_web(env) as base_url, \
                start_worker({**env, "CARPOOL_MODELS": "hemb"}), \
                start_feeder(env, tmp / "feeder.log"), start_dispatcher(env):
            sdks = {key: openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
                    for key in (KEY_OWN, KEY_SHARED)}
            yield Stack(sdks, rx, Outbox(redis_client, Keys(prefix)))
            for sdk in sdks.values():
                sdk.close()
    finally:
        keys = [k for pattern in Keys(prefix).patterns
                for k in redis_client.scan_iter(match=pattern, count=1000)]
        if keys:
            redis_client.delete(*keys)
        redis_client.close()


def create(client: openai.OpenAI, n: int, prefix: str, webhook: str) -> str:
    file_id = client.files.create(
        file=("in.jsonl", io.BytesIO(embedding_lines(n, prefix=prefix))), purpose="batch").id
    return client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                       completion_window="24h",
                                       extra_body={"webhook": webhook}).id


def arrived_once(stack: Stack, batch_id: str, event: str, secret: str) -> None:
    """Wait for ``event`` of ``batch_id`` and the outbox to empty; then it is the only
    delivery for that batch, signed with ``secret``, in OpenAI's event shape."""
    webhook_id = f"{batch_id}.{event}"
    stack.rx.wait_for_ids({webhook_id}, ARRIVAL_TIMEOUT_S)
    wait_until(lambda: stack.outbox.waiting([BULK_HOOK_TAG]) == 0, ARRIVAL_TIMEOUT_S,
               "the batch outbox to empty")
    mine = [r for r in stack.rx.all() if r.webhook_id.startswith(batch_id + ".")]
    assert Counter(r.webhook_id for r in mine) == {webhook_id: 1}
    (r,) = mine
    doc = body_of(r)
    assert Webhook(secret).verify(r.body, r.headers) == doc
    assert doc == {"object": "event", "id": webhook_id, "type": event,
                   "created_at": doc["created_at"], "data": {"id": batch_id}}
    assert isinstance(doc["created_at"], int) and r.path == "/batches"


def test_a_completed_batch_delivers_one_batch_completed_signed_with_its_keys_secret(
        stack: Stack) -> None:
    client = stack.clients[KEY_OWN]
    batch_id = create(client, 20, "ok", f"{stack.rx.url}/batches")
    done = wait_batch(client, batch_id, {"completed", "failed"}, timeout_s=60)
    assert done.status == "completed" and done.request_counts.completed == 20
    arrived_once(stack, batch_id, "batch.completed", KEY_SECRET)
    shown = client.batches.retrieve(batch_id).model_extra["carpool"]  # type: ignore[index]
    assert shown["webhook"] == f"{stack.rx.url}/batches"
    assert shown["webhook_delivery"] == {"state": "delivered", "attempts": 1,
                                         "last_status": 200, "last_error": None,
                                         "event": "batch.completed"}


def test_a_cancelled_batch_delivers_one_signed_batch_cancelled(stack: Stack) -> None:
    client = stack.clients[KEY_SHARED]  # no secret of its own: the deployment's signs
    batch_id = create(client, 2000, "cancel", f"{stack.rx.url}/batches")
    assert client.batches.cancel(batch_id).status in ("cancelling", "cancelled")
    wait_batch(client, batch_id, {"cancelled"}, timeout_s=60)
    arrived_once(stack, batch_id, "batch.cancelled", DEPLOY_SECRET)


@pytest.mark.parametrize(("webhook", "says"), [
    ("http://169.254.169.254/latest/meta-data", "metadata"),  # refused even with private on
    ("ftp://127.0.0.1/x", "scheme"),
    ("http://u:p@127.0.0.1/x", "credentials"),
])
def test_a_refused_webhook_url_at_create_is_a_400(stack: Stack, webhook: str,
                                                   says: str) -> None:
    client = stack.clients[KEY_SHARED]
    before = {b.id for b in client.batches.list(limit=100).data}
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, 1, "refused", webhook)
    assert refused.value.status_code == 400 and says in str(refused.value)
    assert {b.id for b in client.batches.list(limit=100).data} == before


def test_a_batch_that_fails_validation_delivers_one_batch_failed(stack: Stack) -> None:
    client = stack.clients[KEY_SHARED]
    file_id = client.files.create(file=("bad.jsonl", io.BytesIO(b"not json\n")),
                                  purpose="batch").id
    batch_id = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                     completion_window="24h",
                                     extra_body={"webhook": f"{stack.rx.url}/batches"}).id
    assert wait_batch(client, batch_id, {"failed"}, timeout_s=60).errors is not None
    arrived_once(stack, batch_id, "batch.failed", DEPLOY_SECRET)
