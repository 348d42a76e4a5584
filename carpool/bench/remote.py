"""What a bench report can say of a stack it did not start (``--url``): only what the
target itself publishes in ``GET /models``, else "unknown" — never the values this
command would have set for a stack of its own."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from carpool.bench.workload import SYNTHETIC

#: A stack that does not answer /models this fast is described as unknown.
MODELS_TIMEOUT_S = 5.0
UNKNOWN = "unknown"


def _models(url: str) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=MODELS_TIMEOUT_S) as resp:  # noqa: S310
            body = json.loads(resp.read())
    except (OSError, ValueError):
        return []
    models = body.get("models", body) if isinstance(body, dict) else body
    if isinstance(models, dict):
        models = list(models.values())
    return [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []


def _count(value: Any) -> str:
    if isinstance(value, bool):
        return UNKNOWN
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | dict):
        return str(len(value))
    return UNKNOWN


def describe(url: str, sizes: str) -> str:
    """The report's header line for the stack at ``url``."""
    synthetic = next((m for m in _models(url) if m.get("name") == SYNTHETIC), {})
    workers = _count(synthetic.get("workers"))
    cost = synthetic.get("cost_ms")
    cost_text = (f"{cost[0]:g}, {cost[1]:g} ms" if isinstance(cost, list) and len(cost) == 2
                 and all(isinstance(c, int | float) for c in cost)
                 else f"{UNKNOWN} (the target's own CARPOOL_SYNTHETIC_COST_MS)")
    return (f"\n- target {url} (not started by this command): synthetic cost a, b = "
            f"{cost_text}; workers {workers}; sizes {sizes}")
