"""A bin's cost model t(n) = a + b·n, fitted online to the batches a worker runs.

Weighted least squares over (batch size, runtime) pairs with exponential
forgetting, so the fit follows a model that warms up or a GPU that another
process starts sharing. A calibration profile can seed it: the seed counts as
``SEED_WEIGHT`` observations at n = 1 and n = max_batch, and fades like any
other. While every batch so far had the same size the slope cannot be told;
the seed's slope (or 0) stands in for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from carpool.scheduling.batching import Cost

#: Each new batch multiplies the weight of all earlier ones by this (~50 batches remembered).
FORGET = 0.98
#: A calibration seed weighs as much as this many batches at each end.
SEED_WEIGHT = 5.0
#: Below this spread of batch sizes (variance) the slope is not identifiable.
MIN_SIZE_VARIANCE = 0.25


@dataclass
class CostModel:
    """Running sums of a weighted fit; ``cost()`` is None until something is known."""

    seed: Cost | None = None
    batches: int = 0
    _w: float = 0.0
    _n: float = 0.0
    _nn: float = 0.0
    _t: float = 0.0
    _nt: float = 0.0

    @classmethod
    def seeded(cls, seed: Cost | None, max_batch: int) -> CostModel:
        model = cls(seed=seed)
        if seed is not None:
            for n in (1, max(2, max_batch)):
                model._add(float(n), seed.ms(n), SEED_WEIGHT)
        return model

    def _add(self, n: float, t_ms: float, weight: float) -> None:
        self._w += weight
        self._n += weight * n
        self._nn += weight * n * n
        self._t += weight * t_ms
        self._nt += weight * n * t_ms

    def observe(self, n: int, runtime_ms: float) -> None:
        """One batch of ``n`` jobs took ``runtime_ms``."""
        if n < 1 or runtime_ms < 0:
            return
        for name in ("_w", "_n", "_nn", "_t", "_nt"):
            setattr(self, name, getattr(self, name) * FORGET)
        self._add(float(n), runtime_ms, 1.0)
        self.batches += 1

    def cost(self) -> Cost | None:
        """The fitted a and b (both >= 0), or None before any batch or seed."""
        if self._w <= 0:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var_n = self._nn / self._w - mean_n * mean_n
        if var_n >= MIN_SIZE_VARIANCE:
            b = (self._nt / self._w - mean_n * mean_t) / var_n
        else:
            b = self.seed.b_ms if self.seed is not None else 0.0
        b = max(0.0, b)
        a = mean_t - b * mean_n
        if a < 0:  # the data say "no fixed part": refit through the origin
            a, b = 0.0, self._nt / self._nn
        return Cost(a, b)
