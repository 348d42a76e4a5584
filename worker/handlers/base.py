"""The model-handler interface: what the batch runner asks of every model.

A user's own model implements the same methods in a class of their own package
and names it in the catalogue (``kind = "python"``, ``handler =
"mypkg.module:MyHandler"``; docs/own-model.md). carpool constructs it as
``MyHandler(spec, context)``: ``spec`` is its catalogue entry (``spec.options``
holds its own options), ``context`` a ``worker.handlers.tuning.HandlerContext``
(the device, and ``prepare``/``autocast`` for the model's ``dtype``,
``channels_last`` and ``compile`` options).

Where each method runs:

- ``preprocess``: once per job, on a thread pool (decode, tokenize; a raised
  ``carpool.core.errors.InvalidInput`` fails that job alone, with its message);
- ``collate``: once per batch, on the loop's thread: stack the items into the
  bin's shape (pad to ``bin_spec.max_size``, not to the batch's longest), as CPU
  tensors — carpool copies them to the device (pinned, on a copy stream);
- ``forward``: once per batch, on the compute thread, under
  ``torch.inference_mode`` and the model's autocast, with the batch on the device;
  carpool copies its tensors back to the CPU;
- ``postprocess``: on the compute thread, exactly one JSON-able result per item.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from carpool.core.catalogue import BinSpec, ModelSpec


class ModelHandler(Protocol):
    """One loaded model. The runner calls preprocess per job (a failure fails that job
    alone), then collate, forward and postprocess once per batch; postprocess must
    return exactly one JSON-able result per item, in order."""

    spec: ModelSpec

    def load(self) -> None:
        """Load weights and warm up; called once before the first batch."""

    def preprocess(self, job_input: Any) -> Any:
        """Turn one decoded JSON input into a model-ready item (CPU)."""

    def example(self, bin_spec: BinSpec) -> Any:
        """A preprocessed item of the bin's largest shape, for warm-up and calibration."""

    def collate(self, items: Sequence[Any], bin_spec: BinSpec) -> Any:
        """Stack items into one batch, padded to the bin's shape, not the batch's longest."""

    def forward(self, batch: Any) -> Any:
        """Run the model on one batch."""

    def postprocess(self, output: Any, n: int) -> list[Any]:
        """One JSON-able result per item of the batch, in order."""


@runtime_checkable
class SizedItems(Protocol):
    """A handler that can tell a preprocessed item's size in its model's measure.

    Optional: with it, the executor measures the share of each collated batch that
    is padding, and the worker exports it as ``carpool_padding_waste_ratio``. It
    reads what preprocessing already computed (a field, a tensor's length), once
    per item when a batch is collated, so it must be cheap.
    """

    def item_size(self, item: Any) -> int:
        """The item's size in the model's measure (size, tokens), before padding."""
