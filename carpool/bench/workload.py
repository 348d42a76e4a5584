"""What each job asks for: a size from a mix, and a value no other job has.

The synthetic model echoes the value and returns a checksum of the whole
input, so a result delivered to the wrong job is caught by comparing both.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass
from typing import Any

#: The model the bench drives unless told otherwise.
SYNTHETIC = "synthetic"


@dataclass(frozen=True)
class SizeMix:
    """Input sizes and their weights, e.g. ``16`` or ``16:0.7,200:0.2,800:0.1``."""

    sizes: tuple[int, ...]
    weights: tuple[float, ...]

    @classmethod
    def parse(cls, text: str) -> SizeMix:
        sizes: list[int] = []
        weights: list[float] = []
        for part in text.split(","):
            size, _, weight = part.strip().partition(":")
            try:
                sizes.append(int(size))
                weights.append(float(weight) if weight else 1.0)
            except ValueError:
                raise ValueError(
                    f"size mix {text!r}: {part!r} is not SIZE or SIZE:WEIGHT") from None
        if not sizes or min(sizes) < 0 or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"size mix {text!r}: sizes >= 0 and some positive weight, please")
        return cls(tuple(sizes), tuple(weights))

    def draw(self, rng: random.Random) -> int:
        if len(self.sizes) == 1:
            return self.sizes[0]
        return rng.choices(self.sizes, self.weights)[0]


def new_nonce() -> str:
    """One per run: sequence numbers alone would repeat across runs on one Redis."""
    return secrets.token_hex(8)


def make_input(nonce: str, seq: int, size: int, payload: Any = None) -> dict[str, Any]:
    """The synthetic model's input for job ``seq`` of the run ``nonce``."""
    value: dict[str, Any] = {"run": nonce, "seq": seq}
    if payload is not None:
        value["payload"] = payload
    return {"value": value, "size": size}
