"""Blocking on the wake lists of models on several shards of a Redis Cluster.

A worker blocks until a job arrives for one of its models (``BLPOP`` on their wake
lists). On one Redis, one ``BLPOP`` names them all. On a cluster each model's wake
list lives on its model's shard, and a command may not span slots: so here one
thread per wake list blocks on its own list (its own connection, on its own
shard) and sets one event that the batching loop waits on.

A wake-up is a hint that a bin changed, never a job handed over: the loop peeks
after every wait, so a token taken while it was busy costs nothing (the event
stays set and the next wait returns at once).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import redis

log = logging.getLogger(__name__)

#: Longest single BLPOP of a waiter thread, so ``close`` is noticed within it. It must
#: stay under the client's socket timeout.
BLOCK_S = 1
#: Pause after Redis refused or was unreachable, before blocking again.
RETRY_S = 1.0


class ShardWaiters:
    """One thread per wake list; ``wait`` returns once any of them got a token."""

    def __init__(self, client: redis.Redis, wake_keys: Sequence[str]) -> None:
        self.client = client
        self.wake_keys = tuple(wake_keys)
        self.woken = threading.Event()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(key,), daemon=True,
                                         name=f"carpool-wake-{i}")
                        for i, key in enumerate(self.wake_keys)]
        for thread in self.threads:
            thread.start()

    def _run(self, key: str) -> None:
        while not self.stopping.is_set():
            try:
                if self.client.blpop([key], timeout=BLOCK_S) is not None:
                    self.woken.set()
            except redis.RedisError as exc:
                # The loop finds out itself at its next peek; wake it to try.
                log.warning("waiting on %s failed (%s); retrying in %.1f s", key, exc, RETRY_S)
                self.woken.set()
                self.stopping.wait(RETRY_S)

    def wait(self, timeout_s: float) -> bool:
        """True once a token arrived since the last True (then cleared), else False
        after ``timeout_s``. Cleared before the caller peeks, so no change is missed."""
        if self.woken.wait(timeout_s):
            self.woken.clear()
            return True
        return False

    def close(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(BLOCK_S + 1)
