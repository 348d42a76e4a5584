"""The built-in `synthetic` model: costs a + b·n ms per batch of n, GIL released,
like a GPU; its output is computed from its input so misrouting is detectable."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from carpool.catalogue import BinSpec, ModelSpec
from carpool.errors import InvalidInput
from carpool.synthetic import batch_cost_s, expected_result


class SyntheticHandler:
    def __init__(self, spec: ModelSpec, cost_ms: tuple[float, float]) -> None:
        self.spec = spec
        self.a_ms, self.b_ms = cost_ms

    def load(self) -> None:
        return None

    def preprocess(self, job_input: Any) -> dict[str, Any]:
        # The web validated this already; a worker checks again and fails the job
        # alone rather than trusting whatever reached Redis.
        if not isinstance(job_input, dict) or not isinstance(job_input.get("size"), int):
            raise InvalidInput("synthetic input must be {'value': any, 'size': int}")
        return job_input

    def input_size(self, job_input: Any) -> int:
        """Its ``size``: what a real model of this shape would be padded from."""
        return int(job_input["size"])

    def collate(self, items: Sequence[dict[str, Any]], bin_spec: BinSpec) -> list[dict[str, Any]]:
        return list(items)

    def forward(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        time.sleep(batch_cost_s(len(batch), self.a_ms, self.b_ms))  # releases the GIL
        return [expected_result(item) for item in batch]

    def postprocess(self, output: list[dict[str, Any]], n: int) -> list[Any]:
        return list(output)
