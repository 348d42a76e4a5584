"""A ``kind = "python"`` handler that misbehaves as a user's own model might, for the
worker's fault tests: each input says what its forward pass does (``{"do": ...}``),
and ``options.load`` what its load does. Imported by the worker only (on its
PYTHONPATH: the repository root); it needs no torch of its own.

- ``"ok"`` (or no ``do``): the result is ``{"echo": <the input's value>}``;
- ``"hang"``: the forward pass never returns (a deadlock in the model);
- ``"exit"``: the forward pass calls ``sys.exit(3)``;
- ``"raise"``: the forward pass raises ``ValueError`` for this input;
- ``"raise_unprintable"``: the forward pass raises an exception whose ``str()`` raises
  (as some C extensions' errors do);
- ``"cancelled"``: the forward pass raises ``asyncio.CancelledError`` (a
  ``BaseException``), as a model that runs an event loop inside may;
- ``"abort"``, ``"os_exit"``, ``"segfault"``: the forward pass kills its process
  (``os.abort()``, ``os._exit(1)``, a read of address 0), as a native crash in a
  model's library would.

``options.load = "raise"``: ``load`` raises ``RuntimeError`` (weights it cannot read);
``"warm_up"``: the example it gives for warm-up raises in the forward pass;
``"cancelled"``: ``load`` raises ``asyncio.CancelledError`` (a BaseException).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from carpool.core.catalogue import BinSpec, ModelSpec

#: What the load's error says, for the tests to look for.
LOAD_ERROR = "misbehaving model: the weights file is corrupt"


class Unprintable(RuntimeError):
    """An error that cannot say what it is: its ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("this error's message cannot be read")


class Misbehaving:
    def __init__(self, spec: ModelSpec, context: Any) -> None:
        self.spec = spec
        self.load_does = str(spec.options.get("load", "ok"))

    def load(self) -> None:
        if self.load_does == "raise":
            raise RuntimeError(LOAD_ERROR)
        if self.load_does == "cancelled":
            raise asyncio.CancelledError(LOAD_ERROR)

    def preprocess(self, job_input: Any) -> Any:
        return job_input

    def example(self, bin_spec: BinSpec) -> Any:
        return {"do": "raise" if self.load_does == "warm_up" else "ok", "value": 0}

    def collate(self, items: Sequence[Any], bin_spec: BinSpec) -> Any:
        return list(items)

    def forward(self, batch: Any) -> Any:
        for item in batch:
            do = item.get("do", "ok")
            if do == "hang":
                threading.Event().wait()  # never set: a forward pass that never returns
            elif do == "exit":
                sys.exit(3)
            elif do == "abort":
                os.abort()
            elif do == "os_exit":
                os._exit(1)
            elif do == "segfault":
                ctypes.string_at(0)
            elif do == "cancelled":
                raise asyncio.CancelledError("the model's event loop was cancelled")
            elif do == "raise_unprintable":
                raise Unprintable()
            elif do == "raise":
                raise ValueError(f"cannot run value {item.get('value')!r}")
        return batch

    def postprocess(self, output: Any, n: int) -> Any:
        outs = {item.get("out", "ok") for item in output}
        if "none" in outs:
            return None
        if "short" in outs:
            return [{"echo": item.get("value")} for item in output][1:]
        if "big" in outs:  # each result a string of ``value`` MiB
            return [{"blob": "x" * (int(item.get("value", 0)) << 20)} for item in output]
        if "dict" in outs:
            return {"echo": [item.get("value") for item in output]}
        return [{"echo": item.get("value")} for item in output]
