"""A ``kind = "python"`` handler whose load waits for the test: it says it started
loading (a file appears, ``options.started``), then waits for ``options.gate`` to
appear, and then refuses (a ``ConfigError``, as a model without weights does). A
test holds a real worker "still loading" for as long as it needs, with no timing
guess. Imported by the worker only (on its PYTHONPATH: the repository root)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import ConfigError
from carpool.stack.waiting import wait_until

#: Longest a load waits for its gate: past any test's own timeout.
GATE_TIMEOUT_S = 300.0
#: What the refusal says, for the tests to look for.
REFUSAL = "gated model: refused on purpose once its gate opened"


class GatedLoad:
    def __init__(self, spec: ModelSpec, context: Any) -> None:
        self.started = Path(spec.options["started"])
        self.gate = Path(spec.options["gate"])

    def load(self) -> None:
        self.started.touch()
        wait_until(self.gate.exists, GATE_TIMEOUT_S, f"the gate {self.gate}")
        raise ConfigError(REFUSAL)

    # Never called: the model is refused at load.
    def preprocess(self, job_input: Any) -> Any:
        raise NotImplementedError

    def example(self, bin_spec: BinSpec) -> Any:
        raise NotImplementedError

    def collate(self, items: Sequence[Any], bin_spec: BinSpec) -> Any:
        raise NotImplementedError

    def forward(self, batch: Any) -> Any:
        raise NotImplementedError

    def postprocess(self, output: Any, n: int) -> list[Any]:
        raise NotImplementedError
