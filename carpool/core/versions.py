"""A model's versions: ``[models.<m>.versions.<v>]`` in the catalogue file
(docs/deployments.md)::

    [models.mine]
    version = "1"                      # the entry's own version (default "1")
    [models.mine.versions.2]           # any key of the entry, over the entry's own
    options = { weights = "/models/mine-2.pt2" }

Each declared version is a model of its own inside carpool, named ``<m>@<v>`` (its
*internal name*): the model's entry with the version's keys over it (an options table
merges key by key, a bin list replaces the whole), with its own bins, Redis keys,
cost model and admission pace. So a job's version is fixed when it enters a bin, no
batch can hold two versions, and a worker serves a version by naming ``<m>@<v>`` in
``CARPOOL_MODELS``. The model's own entry keeps its plain name ``<m>`` (its keys, job
ids and queued jobs stay as they were), and ``<m>@<its version>`` names it too.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from carpool.core.errors import ConfigError, UnknownModel

#: Between a model's name and a version's in an address and an internal name.
SEPARATOR = "@"
#: The version of a model entry that does not say.
DEFAULT_VERSION = "1"
#: A version name is part of URL paths (/v2/models/<m>/versions/<v>) and Redis keys.
VERSION_CHARS = frozenset(string.ascii_letters + string.digits + "._-")
MAX_VERSION_CHARS = 64
#: Keys a version's table may not set: its name is the table's, and it has no versions.
NOT_IN_A_VERSION = frozenset({"version", "versions"})


class Versioned(Protocol):
    """What resolving a name needs of a catalogue entry (carpool.core.catalogue.ModelSpec)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def family(self) -> str: ...


Spec = TypeVar("Spec", bound=Versioned)


def internal_name(model: str, version: str) -> str:
    """The catalogue name of ``model``'s declared version ``version``."""
    return f"{model}{SEPARATOR}{version}"


def split(name: str) -> tuple[str, str]:
    """(the model, the version) an internal name or address names; "" for no version."""
    model, _, version = name.partition(SEPARATOR)
    return model, version


def check_version(where: str, version: Any) -> str:
    """``version`` when it is a usable version name; ConfigError naming ``where`` if not."""
    if (not isinstance(version, str) or not version or len(version) > MAX_VERSION_CHARS
            or not set(version) <= VERSION_CHARS):
        raise ConfigError(f"{where}: a version is 1 to {MAX_VERSION_CHARS} letters, digits, "
                          f"'.', '-' or '_' (it goes in URLs and Redis keys), got {version!r}")
    return version


def split_versions(model: str, table: Mapping[str, Any]
                   ) -> tuple[dict[str, Any], Mapping[str, Mapping[str, Any]]]:
    """A catalogue file's ``[models.<model>]`` table as (the entry's own keys, each
    declared version's table); ConfigError naming the entry that is malformed."""
    if SEPARATOR in model:
        raise ConfigError(f"[models.{model!r}]: a model's name may not hold {SEPARATOR!r}; "
                          f"declare a version as [models.<m>.versions.<v>]")
    own = dict(table)
    if "version" in own:  # TOML's `version = 2` is the version "2"
        raw = own["version"]
        own["version"] = check_version(f"[models.{model}] version",
                                       str(raw) if type(raw) is int else raw)
    declared = own.pop("versions", {})
    if not isinstance(declared, Mapping):
        raise ConfigError(f"[models.{model}] versions: a table of tables, "
                          f"[models.{model}.versions.<v>]")
    for version, overrides in declared.items():
        where = f"[models.{model}.versions.{version}]"
        check_version(where, version)
        if not isinstance(overrides, Mapping):
            raise ConfigError(f"{where}: a table of the entry's keys to override")
        refused = sorted(NOT_IN_A_VERSION & set(overrides))
        if refused:
            raise ConfigError(f"{where}: {refused} cannot be set in a version (its name is "
                              "the table's)")
    return own, declared


def expand(own: Spec, declared: Mapping[str, Mapping[str, Any]],
           build: Callable[[Spec, str, Mapping[str, Any]], Spec]) -> dict[str, Spec]:
    """Each declared version of the model whose own entry is ``own``, by internal name:
    ``build(own, version, its table)``; ConfigError naming the version's entry."""
    out = {}
    for version, overrides in declared.items():
        where = f"[models.{own.name}.versions.{version}]"
        if version == own.version:
            raise ConfigError(f"{where}: version {version!r} is the entry's own "
                              f"([models.{own.name}] version); name the new one differently")
        try:
            out[internal_name(own.name, version)] = build(own, version, overrides)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return out


def versions_of(models: Mapping[str, Versioned], model: str) -> list[str]:
    """The versions of ``model`` in ``models``: its own entry's first."""
    own = models.get(model)
    declared = sorted(s.version for s in models.values() if s.family == model)
    return ([own.version] if own is not None else []) + declared


def resolve(models: Mapping[str, Spec], name: str) -> Spec | None:
    """The entry ``name`` addresses: an internal name, or ``<m>@<v>`` where ``v`` is
    ``m``'s own version; None for an unknown model, UnknownModel (404) naming the
    versions that exist for an unknown version of a known one."""
    found = models.get(name)
    if found is not None:
        return found
    model, version = split(name)
    own = models.get(model)
    if own is None or not version:
        return None
    if version == own.version:
        return own
    raise UnknownModel(f"model {model!r} has no version {version[:MAX_VERSION_CHARS]!r}; "
                       f"its versions: {', '.join(versions_of(models, model))}")


def version_map(specs: Iterable[Versioned]) -> dict[str, str]:
    """Each catalogue name's version: what a job document shows for a job of a model's
    own entry, whose catalogue name does not say (carpool.core.jobs.model_version)."""
    return {spec.name: spec.version for spec in specs}
