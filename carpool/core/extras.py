"""Packages of optional extras, imported when a command first needs them.

``carpool bench --help`` and the bench's argument checks work with the core
install alone; the progress bar (tqdm) and the plots (matplotlib) come with
``pip install 'carpool[bench]'``, and a command that needs them says so at once,
before it starts any work, instead of failing at its end.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from carpool.core.errors import MissingExtra

#: The packages ``carpool bench`` and ``carpool bench simulate`` need to run.
BENCH_PACKAGES = ("tqdm", "matplotlib")


def require(module: str, extra: str = "bench") -> ModuleType:
    """``module``, imported; MissingExtra naming the extra to install if it is absent."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise MissingExtra(
            f"{exc.name or module} is not installed: install the {extra} extra with "
            f"pip install 'carpool[{extra}]'") from None


def require_bench() -> None:
    """Every package of the bench extra, before a command spends time on a run."""
    for module in BENCH_PACKAGES:
        require(module)


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend (files only, never a window)."""
    matplotlib = require("matplotlib")
    matplotlib.use("Agg")  # before pyplot is imported
    return require("matplotlib.pyplot")
