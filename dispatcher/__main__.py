"""``python -m dispatcher``: run one webhook dispatcher until SIGTERM or SIGINT."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType

from carpool.backend.connection import connect
from carpool.core.errors import ConfigError
from carpool.core.settings import load_settings
from dispatcher.dispatcher import Dispatcher

log = logging.getLogger("dispatcher")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"carpool dispatcher: {exc}", file=sys.stderr)
        return 2
    client = connect(settings.redis_url, cluster=settings.redis_cluster)
    dispatcher = Dispatcher(settings, client)
    hooks = settings.webhooks
    if not hooks.secret:
        log.warning("CARPOOL_WEBHOOK_SECRET is not set: jobs of keys without a "
                    "webhook_secret are delivered without a webhook-signature")
    dispatcher.metrics.serve(hooks.metrics_port, settings.worker_metrics_addr)
    stop = threading.Event()

    def stopping(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: finishing the deliveries in flight", signum)
        stop.set()

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    log.info("dispatching webhooks of %d outboxes (the batches', each shard's), %d at once",
             len(dispatcher.tags), hooks.concurrency)
    dispatcher.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
