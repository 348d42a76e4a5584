"""The process command lines, from ``carpool/stack/commands.toml`` (shipped package data).

One source: the Dockerfiles' CMD, compose and Kubernetes equal these lists (the
deploy tests check it), and `carpool up`, the bench stacks, the ops scripts and the
end-to-end tests start their processes from them, so what runs locally and in
tests is what the images run.
"""

from __future__ import annotations

import sys
import tomllib
from importlib.resources import files

#: The node-name placeholder of the worker's argv, and Flower's port option.
NODE_ARG, FLOWER_PORT_PREFIX = "worker@%h", "--port="


def load_commands() -> dict[str, list[str]]:
    """Each process name (``web``, ``worker``, ``flower``, ``dispatcher``) mapped to its
    argv."""
    table = tomllib.loads(files("carpool.stack").joinpath("commands.toml").read_text())
    return {name: list(entry["argv"]) for name, entry in table.items()}


def argv(name: str, *, node: str | None = None, port: int | None = None) -> list[str]:
    """The argv of one process as shipped; ``node`` replaces the worker's node name
    (``worker@%h``), ``port`` Flower's ``--port=``."""
    out = []
    for arg in load_commands()[name]:
        if node is not None and arg == NODE_ARG:
            arg = node
        elif port is not None and arg.startswith(FLOWER_PORT_PREFIX):
            arg = f"{FLOWER_PORT_PREFIX}{port}"
        out.append(arg)
    return out


def python_argv(name: str, *, node: str | None = None, port: int | None = None) -> list[str]:
    """``argv`` run by this interpreter (``python -m gunicorn ...``): no reliance on the
    venv's scripts being on PATH."""
    program, *rest = argv(name, node=node, port=port)
    if program == "python":  # already a module run: ``python -m dispatcher``
        return [sys.executable, *rest]
    return [sys.executable, "-m", program, *rest]
