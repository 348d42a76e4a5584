"""The batch sizes a GPU worker runs: a short ladder that warm-up covers.

With ``cudnn.benchmark`` on, cuDNN autotunes its convolution algorithms for every
new input shape, the first time it meets it: hundreds of milliseconds to
seconds for a ResNet-50, paid by the batch that meets it. Serving meets many
batch sizes (partial batches, the memory guard's caps, split halves), so on a
GPU the executor pads each batch up to the next size of this ladder — repeating
its last item, so the padding is a valid input — and warm-up runs every rung up
to the bin's limit. Rungs are the powers of two and their halfway points
(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, …): padding wastes at most a third
of a batch's compute (17 → 24), about 2·log2(max_batch) sizes to warm up.
"""

from __future__ import annotations


def rungs(max_batch: int) -> list[int]:
    """The ladder up to ``max_batch``, which is always a rung itself."""
    sizes = {max_batch}
    power = 1
    while power <= max_batch:
        sizes.add(power)
        if power + power // 2 <= max_batch and power >= 2:
            sizes.add(power + power // 2)
        power *= 2
    return sorted(sizes)


def snap_down(n: int, limit: int) -> int:
    """The largest rung of ``limit``'s ladder not above ``n`` (at least 1): a memory
    cap of 40 under a ``max_batch`` of 64 serves 32, a size warm-up ran."""
    return max((r for r in rungs(limit) if r <= n), default=1)


def padded(n: int, limit: int) -> int:
    """The rung a batch of ``n`` runs at: the smallest rung of ``limit``'s ladder that
    holds it (``n`` itself, if it is above ``limit``)."""
    return next((r for r in rungs(limit) if r >= n), n)
