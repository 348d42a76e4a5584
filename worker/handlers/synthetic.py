"""The built-in `synthetic` model: costs a + b·n ms per batch of n, GIL released,
like a GPU; its output is computed from its input so misrouting is detectable."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import ConfigError, InvalidInput
from carpool.core.settings import Settings
from carpool.core.synthetic import batch_cost_s, expected_result

#: TEST ONLY: with ``CARPOOL_SYNTHETIC_POISON=1``, this input value kills the worker
#: process outright (no exception, no cleanup), like a segfault in a model would.
POISON_VALUE = "__crash__"
#: The exit status of a worker killed by the poison input.
POISON_EXIT_STATUS = 70
#: TEST ONLY: with ``CARPOOL_SYNTHETIC_POISON=1``, this input value makes the forward
#: pass raise what a device-side assert raises: a sticky CUDA error, which ends the
#: worker (``worker.loop.loop.EXIT_DEVICE_LOST``) after it hands its batches back.
DEVICE_ASSERT_VALUE = "__device_assert__"
DEVICE_ASSERT_MESSAGE = "CUDA error: device-side assert triggered (simulated)"


class SyntheticHandler:
    def __init__(self, spec: ModelSpec, cost_ms: tuple[float, float],
                 poison: bool = False, call_log: str = "") -> None:
        self.spec = spec
        self.a_ms, self.b_ms = cost_ms
        self.poison = poison
        #: Test-only (CARPOOL_SYNTHETIC_CALL_LOG): one JSON line per model call.
        self.call_log = call_log
        #: ``options.load_delay_ms``: how long a load takes, as a large model's would.
        self.load_delay_ms = spec.options.get("load_delay_ms", 0)
        if type(self.load_delay_ms) is not int or self.load_delay_ms < 0:
            raise ConfigError(f"model {spec.name!r}: options.load_delay_ms must be a whole "
                              f"number of ms >= 0, not {self.load_delay_ms!r}")

    def load(self) -> None:
        time.sleep(self.load_delay_ms / 1000.0)

    def preprocess(self, job_input: Any) -> dict[str, Any]:
        # The web validated this already; a worker checks again and fails the job
        # alone rather than trusting whatever reached Redis.
        if not isinstance(job_input, dict) or not isinstance(job_input.get("size"), int):
            raise InvalidInput("synthetic input must be {'value': any, 'size': int}")
        if self.poison and job_input.get("value") == POISON_VALUE:
            os._exit(POISON_EXIT_STATUS)  # test-only fault injection, see POISON_VALUE
        return job_input

    def item_size(self, item: dict[str, Any]) -> int:
        """Its ``size``: what a real model of this shape would be padded from."""
        return int(item["size"])

    def example(self, bin_spec: BinSpec) -> dict[str, Any]:
        """An input of the bin's largest size (``carpool calibrate synthetic``)."""
        return {"value": 0, "size": bin_spec.max_size}

    def collate(self, items: Sequence[dict[str, Any]], bin_spec: BinSpec) -> list[dict[str, Any]]:
        return list(items)

    def forward(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.call_log:
            with open(self.call_log, "a") as log:  # one write per call: lines stay whole
                log.write(json.dumps([item.get("value") for item in batch]) + "\n")
        time.sleep(batch_cost_s(len(batch), self.a_ms, self.b_ms))  # releases the GIL
        if self.poison and any(item.get("value") == DEVICE_ASSERT_VALUE for item in batch):
            raise RuntimeError(DEVICE_ASSERT_MESSAGE)  # test-only, see DEVICE_ASSERT_VALUE
        return [expected_result(item) for item in batch]

    def postprocess(self, output: list[dict[str, Any]], n: int) -> list[Any]:
        return list(output)


def handler_for(spec: ModelSpec, settings: Settings) -> SyntheticHandler:
    """The handler for a ``kind = "synthetic"`` model (carpool/core/kinds.py)."""
    return SyntheticHandler(spec, settings.synthetic_cost_ms, settings.synthetic_poison,
                            call_log=settings.synthetic_call_log)
