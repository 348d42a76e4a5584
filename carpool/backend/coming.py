"""Workers starting for a model, as admission counts them (coming.lua; lib/pace.lua's
``model_coming``): how many, and in how many ms they serve. One call per model per
write; `carpool up`'s autoscaler writes while workers it started are not serving yet."""

from __future__ import annotations

import redis

from carpool.backend.args import ComingArgs
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.core.script_args import argv, keys_of


class Coming:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.keys = keys
        self._script = load_script(client, "coming")

    def say(self, model: str, workers: int, ready_in_ms: int) -> int:
        """``workers`` start serving ``model`` in ``ready_in_ms``; Redis's time now."""
        args = ComingArgs(starting=workers, ready_in_ms=max(0, ready_in_ms))
        with redis_errors():
            return int(self._script(keys=keys_of(ComingArgs,
                                                 model_stats=self.keys.model_stats(model)),
                                    args=argv(args)))
