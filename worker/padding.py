"""Padding waste: the share of a padded batch that is padding, not input.

Inputs are padded to their bin's ``max_size`` (tokens, pixels, size), not to the
batch's longest, so the waste of one batch is ``1 − Σ sizes / (n · max_size)``.
A handler reports an input's size by having an ``input_size`` method
(``worker.handlers.base.SizedInputs``); without one, its waste is not measured.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from carpool.catalogue import BinSpec
from carpool.jobs import ClaimedJob
from worker.handlers.base import ModelHandler, SizedInputs

log = logging.getLogger(__name__)


def padding_waste(handler: ModelHandler, bin_spec: BinSpec,
                  jobs: Sequence[ClaimedJob]) -> float | None:
    """The batch's padding share in [0, 1], or None when the handler cannot tell sizes."""
    if not isinstance(handler, SizedInputs) or bin_spec.max_size <= 0:
        return None
    sizes: list[int] = []
    for job in jobs:
        try:
            size = handler.input_size(json.loads(job.input_json))
        except Exception:  # noqa: BLE001 — a bad input failed its own job; it has no size
            continue
        sizes.append(min(bin_spec.max_size, max(0, size)))
    if not sizes:
        return None
    return 1.0 - sum(sizes) / (len(sizes) * bin_spec.max_size)
