"""Fair share between API keys, through real gunicorn: near a bin's bound the key over
its share gets 429 ``over_share`` with its own Retry-After; the other is still admitted;
and a flooding key's backlog does not delay the quiet key's new job (fair queueing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.admission.fair_share import FAIR_SHARE_NEAR
from carpool.backend.queue import Queue
from carpool.client import Client, Overloaded, RetryPolicy
from carpool.core.catalogue import load_catalogue
from tests.conftest import make_env
from tests.redis.test_admission import drain
from tests.support.procs import start_web

FLOOD, QUIET = "flood-key-0123456789abcdef", "quiet-key-0123456789abcdef"
DEPTH = 20
#: A model no worker serves, bounded by depth alone (max_queue_ms = 0).
SHARED_TOML = f"""
[models.shared]
kind = "synthetic"
measure = "size"
max_queue_ms = 0
[[models.shared.bins]]
name = "only"
max_size = 10
max_batch = 2
max_wait_ms = 5
max_depth = {DEPTH}
"""


def test_the_flooding_key_is_refused_first_and_the_quiet_one_still_admitted(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    cfg = tmp_path / "catalogue.toml"
    cfg.write_text(SHARED_TOML)
    keys = tmp_path / "keys"
    keys.write_text(f"# two tenants\n{FLOOD}\n{QUIET} weight=1\n")
    env = make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(cfg),
                   CARPOOL_API_KEYS_FILE=str(keys))
    job = {"value": 0, "size": 1}
    once = RetryPolicy(attempts=1)
    with start_web(env) as base, Client(base, FLOOD, retry=once) as flood, \
            Client(base, QUIET, retry=once) as quiet:
        near = int(FAIR_SHARE_NEAR * DEPTH)
        for _ in range(near):
            flood.submit("shared", job)
        quiet.submit("shared", job)
        with pytest.raises(Overloaded) as info:
            flood.submit("shared", job)
        assert info.value.code == "over_share" and (info.value.retry_after_s or 0) >= 1
        for _ in range(DEPTH - near - 1):  # the quiet key fills the rest of the bin
            quiet.submit("shared", job)
        with pytest.raises(Overloaded) as full:
            quiet.submit("shared", job)
        assert full.value.code == "bin_full"


#: A model no worker serves whose bin has a drain rate (made by the test), so admission
#: orders the bin by the owners' virtual clocks; bounded by depth alone.
ORDERED_TOML = """
[models.ordered]
kind = "synthetic"
measure = "size"
max_queue_ms = 0
[[models.ordered.bins]]
name = "small"
max_size = 10
max_batch = 2
max_wait_ms = 5
max_depth = 100
"""
#: The flooding key's backlog: ~1.5 s of its virtual clock at the ~10 jobs/s drained.
BACKLOG = 16


def test_the_quiet_keys_new_job_sorts_ahead_of_the_flooding_keys_backlog(
        redis_url: str, key_prefix: str, queue: Queue, tmp_path: Path) -> None:
    cfg = tmp_path / "catalogue.toml"
    cfg.write_text(ORDERED_TOML)
    keys = tmp_path / "keys"
    keys.write_text(f"{FLOOD}\n{QUIET}\n")
    env = make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(cfg),
                   CARPOOL_API_KEYS_FILE=str(keys))
    spec = load_catalogue(cfg).get("ordered")
    job = {"value": 0, "size": 1}
    once = RetryPolicy(attempts=1)
    with start_web(env) as base, Client(base, FLOOD, retry=once) as flood, \
            Client(base, QUIET, retry=once) as quiet:
        drain(queue, spec)  # ~10 jobs/s, as a worker would have drained them
        backlog = [flood.submit("ordered", job).id for _ in range(BACKLOG)]
        mine = quiet.submit("ordered", job).id
    order = queue.client.zrange(queue.keys.bin("ordered", "small"), 0, -1)
    # Only the flood's first few (the first batch, and those whose turn came while the
    # requests went through gunicorn) sort ahead of the quiet key's job.
    assert order.index(mine) <= 6, order.index(mine)
    assert [j for j in order if j != mine] == backlog
