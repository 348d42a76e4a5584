"""The v2 smoke test with KServe's own REST client (``kserve.InferenceRESTClient``).

Run by the Python of a venv that has ``kserve`` (it does not import carpool):
``python kserve_smoke.py BASE_URL FULL_MODEL``; prints one JSON line of what it saw.
KServe pins packages this project's venv has newer (psutil), so it lives apart:
tests/e2e/test_e2e_open_inference_tritonclient.py runs it with ``CARPOOL_TEST_KSERVE_PYTHON``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def smoke(base: str, full_model: str) -> dict[str, Any]:
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60, retries=0))
    seen: dict[str, Any] = {
        "live": await client.is_server_live(base),
        "ready": await client.is_server_ready(base),
        "model_ready": await client.is_model_ready(base, "synthetic"),
    }
    rows = np.array([[0.5, 1.5], [2.5, -3.0]], dtype=np.float32)
    for binary in (False, True):
        tensor = InferInput("VALUE", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows, binary_data=binary)
        request = InferRequest("synthetic", [tensor], request_id=f"k-{binary}")
        response = await client.infer(base, request, model_name="synthetic")
        echo = next(o for o in response.outputs if o.name == "ECHO").as_numpy()
        seen[f"echo_{'binary' if binary else 'json'}"] = echo.tolist()
        seen[f"id_{'binary' if binary else 'json'}"] = response.id
    tensor = InferInput("VALUE", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 1), dtype=np.float32), binary_data=False)
    try:
        await client.infer(base, InferRequest(full_model, [tensor]), model_name=full_model)
        seen["refused"] = None
    except httpx.HTTPStatusError as exc:
        seen["refused"] = exc.response.status_code
        seen["refused_body"] = exc.response.json()
    await client.close()
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(smoke(sys.argv[1], sys.argv[2]))))
