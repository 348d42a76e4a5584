"""The receiver example in docs/webhooks.md runs, verifies a signed delivery, drops a
duplicate and refuses a forged one."""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from dispatcher.signing import delivery_headers

DOC = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"
SECRET = "whsec_" + base64.b64encode(b"r" * 32).decode()


def example() -> str:
    text = DOC.read_text().split("## Receiving and verifying", 1)[1]
    found = re.search(r"```python\n(.*?)```", text, re.S)
    assert found
    return found.group(1)


def test_the_receiver_example_is_ten_lines_and_works(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code = example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 12
    monkeypatch.setenv("CARPOOL_WEBHOOK_SECRET", SECRET)
    space: dict[str, Any] = {"__name__": __name__}  # Flask finds its root by the module
    exec(compile(code, str(DOC), "exec"), space)  # noqa: S102 — our own documentation
    http = space["app"].test_client()
    body = json.dumps({"id": "j1", "status": "done", "event": "done", "result": 7})
    headers = delivery_headers(SECRET, "j1.done", body, time.time())
    for _ in range(2):
        assert http.post("/carpool-hook", data=body, headers=headers).status_code == 204
    assert capsys.readouterr().out == "done j1 7\n"  # once: the second was a duplicate
    forged = {**headers, "webhook-signature": "v1," + base64.b64encode(b"x" * 32).decode()}
    assert http.post("/carpool-hook", data=body, headers=forged).status_code == 401
