"""The built-in ``hashembed`` model: a text embedder with no weights, for tests and
benchmarks of the embeddings path at scale. Its vector is a function of the text
alone (a SHA-256 stream, normalised), so a result delivered to the wrong line
shows; it costs what the synthetic cost says (CARPOOL_SYNTHETIC_COST_MS: a + b·n ms
per batch of n), GIL released, like a GPU."""

from __future__ import annotations

import hashlib
import math
import struct
import time
from collections.abc import Sequence
from typing import Any

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import InvalidInput
from carpool.core.settings import Settings
from carpool.core.synthetic import batch_cost_s

#: The vector's length unless the catalogue's ``options.dim`` says otherwise.
DEFAULT_DIM = 8


def hash_vector(text: str, dim: int) -> list[float]:
    """The unit vector of ``text``: tests compute the same to check a result."""
    stream = b""
    counter = 0
    while len(stream) < 4 * dim:
        stream += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    raw = [(v / 2**31) - 1.0 for v in struct.unpack(f"<{dim}I", stream[:4 * dim])]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


class HashEmbedHandler:
    def __init__(self, spec: ModelSpec, cost_ms: tuple[float, float]) -> None:
        self.spec = spec
        self.a_ms, self.b_ms = cost_ms
        self.dim = int(spec.options.get("dim", DEFAULT_DIM))

    def load(self) -> None:
        return None

    def preprocess(self, job_input: Any) -> str:
        if not isinstance(job_input, dict) or not isinstance(job_input.get("text"), str):
            raise InvalidInput("hashembed input must be {'text': str}")
        return str(job_input["text"])

    def example(self, bin_spec: BinSpec) -> str:
        return "x" * bin_spec.max_size

    def collate(self, items: Sequence[str], bin_spec: BinSpec) -> list[str]:
        return list(items)

    def forward(self, batch: list[str]) -> list[dict[str, Any]]:
        time.sleep(batch_cost_s(len(batch), self.a_ms, self.b_ms))  # releases the GIL
        return [{"embedding": hash_vector(t, self.dim), "dim": self.dim,
                 "tokens": len(t.split()), "truncated": False} for t in batch]

    def postprocess(self, output: list[dict[str, Any]], n: int) -> list[Any]:
        return list(output)


def handler_for(spec: ModelSpec, settings: Settings) -> HashEmbedHandler:
    """The handler for a ``kind = "hashembed"`` model (carpool/core/kinds.py)."""
    return HashEmbedHandler(spec, settings.synthetic_cost_ms)
