"""``python -m feeder``: run bulk batches until SIGTERM or SIGINT (docs/batches.md)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType

import redis

from carpool.backend.bulkdb import BulkDb
from carpool.backend.connection import connect, open_pubsub
from carpool.backend.filestore import S3FileStore, file_store
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.errors import BackendUnavailable, ConfigError
from carpool.core.settings import load_settings
from carpool.core.versions import version_map
from feeder.feeder import Feeder, run_forever

log = logging.getLogger("carpool.feeder")

#: The longest an idle feeder waits for a job to end before it looks again, in
#: seconds: a new batch or a cancel is seen within it.
IDLE_WAIT_S = 0.2


class DoneWake:
    """Wait for the next ``{p}:done`` message (a batch of jobs ended), at most IDLE_WAIT_S."""

    def __init__(self, client: redis.Redis, channel: str) -> None:
        self.client, self.channel = client, channel
        self.pubsub: redis.client.PubSub | None = None

    def __call__(self, stop: threading.Event) -> None:
        try:
            if self.pubsub is None:
                self.pubsub = open_pubsub(self.client, ignore_subscribe_messages=True)
                self.pubsub.subscribe(self.channel)
            message = self.pubsub.get_message(timeout=IDLE_WAIT_S)
            while message is not None:  # drain: one step answers them all
                message = self.pubsub.get_message(timeout=0)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self.pubsub = None
            stop.wait(IDLE_WAIT_S)  # Redis is away; the next step says so and backs off


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        settings = load_settings()
        store = file_store(settings.bulk)
        if isinstance(store, S3FileStore):
            store.check()  # a missing bucket or refused credentials: no retry mends them
    except ConfigError as exc:
        print(f"carpool feeder: {exc}", file=sys.stderr)
        return 2
    except BackendUnavailable as exc:  # it may come back: each step retries it
        log.warning("feeder: %s; starting all the same", exc)
    client = connect(settings.redis_url, cluster=settings.redis_cluster)
    keys = Keys(settings.key_prefix)
    queue = Queue(client, keys, version_map(settings.catalogue))
    feeder = Feeder(settings, queue, BulkDb(client, keys), store)
    feeder.metrics.serve(settings.bulk.metrics_port, settings.worker_metrics_addr)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("feeder ready (files: %s)", settings.bulk.s3_bucket or
             settings.bulk.files_dir)
    run_forever(feeder, stop, DoneWake(client, keys.done_channel))
    log.info("feeder stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
