"""A Lua script's arguments, named: one mechanism for every script.

Each script called from Python has one frozen dataclass, a ``ScriptArgs``, whose
fields are its fixed ARGV in order, named as the script's header names them;
``KEYS`` names its keys in order (a name ending in ``*`` is a run of keys, one per
bin or job) and ``REST`` the runs of ARGV after the fields. ``argv`` and
``keys_of`` turn them into the lists a call sends. ``tests/unit/test_script_args.py``
reads every script's header and checks these names against it, in order.

It lives in the core, not beside the scripts in ``carpool.backend``: admission's
``AdmitArgs`` is one of them, and admission may not import the backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import Any, ClassVar

Arg = str | int


class ScriptArgs:
    """The base of every script's arguments (subclasses are frozen dataclasses)."""

    #: The script, ``carpool/backend/lua/<SCRIPT>.lua``.
    SCRIPT: ClassVar[str]
    #: Its KEYS' names in order; ``name*``: a run of keys.
    KEYS: ClassVar[tuple[str, ...]]
    #: The names of the runs of ARGV after the fields, in order.
    REST: ClassVar[tuple[str, ...]] = ()


_NAMES: dict[type[ScriptArgs], tuple[str, ...]] = {}


def field_names(cls: type[ScriptArgs]) -> tuple[str, ...]:
    """The fields of ``cls`` in order: its fixed ARGV's names."""
    names = _NAMES.get(cls)
    if names is None:
        dataclass_type: Any = cls
        names = _NAMES[cls] = tuple(f.name for f in fields(dataclass_type))
    return names


def argv(args: ScriptArgs, *rest: Iterable[object]) -> list[Arg]:
    """The script's ARGV: ``args``' fields in order, as Redis reads them, then each of
    ``rest``, one per name in ``REST``."""
    if len(rest) != len(args.REST):
        raise TypeError(f"{args.SCRIPT}.lua takes {len(args.REST)} runs of ARGV after "
                        f"its fields {args.REST}, {len(rest)} given")
    out = [_arg(getattr(args, name)) for name in field_names(type(args))]
    for run in rest:
        out += [_arg(v) for v in run]
    return out


def keys_of(cls: type[ScriptArgs], **named: str | Sequence[str]) -> list[str]:
    """The script's KEYS, each given by its name in ``cls.KEYS`` (a run as a sequence),
    in the script's order."""
    names = [k.rstrip("*") for k in cls.KEYS]
    if sorted(named) != sorted(names):
        raise TypeError(f"{cls.SCRIPT}.lua takes KEYS {names}, given {sorted(named)}")
    out: list[str] = []
    for declared, name in zip(cls.KEYS, names, strict=True):
        value = named[name]
        if declared.endswith("*"):
            out += value
        else:
            assert isinstance(value, str)
            out.append(value)
    return out


def _arg(value: object) -> Arg:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:g}"
    assert isinstance(value, str | int), value
    return value
