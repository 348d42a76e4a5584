"""A model's rollout (docs/deployments.md): which version the jobs that name none go
to, which version shadows its jobs, and which versions are retiring. The rules here
are pure; the state lives in Redis (carpool/backend/rollouts.py) and each web process
reads it at most ``ROLLOUT_REFRESH_S`` old.

- ``{"version": v, "percent": p}``: a job that names no version goes to ``v`` with
  probability ``p`` %, else to the model's own entry. Decided once, at admission.
- ``{"shadow": v, "percent": p}``: ``p`` % of the model's jobs (any version but ``v``)
  are copied to ``v`` at the bulk level; the copy's result is compared with the
  served one (``agrees``) and never answered.
- ``{"retire": v}``: ``v`` admits nothing new; its queued and running jobs finish.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from carpool.core.catalogue import Catalogue, ModelSpec
from carpool.core.errors import CarpoolError, InvalidInput, ModelRefused

#: How old a web process's view of the rollouts may be: a change (a rollback too)
#: reaches every process within this long; the process that made it, at once.
ROLLOUT_REFRESH_S = 1.0
#: A retiring version counts as drained no sooner than this after it was retired: no
#: web process can still admit to it from an older view.
RETIRE_SETTLE_MS = int(2 * ROLLOUT_REFRESH_S * 1000)
#: Embeddings agree when the cosine of the two vectors is at least this: a version
#: that only changes rounding (another dtype) agrees, a new pooling does not.
SHADOW_COSINE_MIN = 0.99
#: The kinds whose results are compared by their vector (the rest: top-1, or equality).
EMBEDDING_KINDS = frozenset({"text", "hashembed"})
#: What a PUT body may change, one at a time.
CHANGES = ("version", "shadow", "retire")


class RolloutConflict(CarpoolError):
    """Raised when a rollout change contradicts the model's state (409): retiring a
    version jobs still go to, or shadowing to a retiring one."""


class VersionRetiring(ModelRefused):
    """Raised when a job names a version that is retiring: it admits nothing new (503)."""


@dataclass(frozen=True)
class Rollout:
    """One model's rollout state; the empty one sends every job to the version it names
    (none: the model's own entry)."""

    version: str = ""
    percent: float = 0.0
    shadow: str = ""
    shadow_percent: float = 0.0
    #: Versions retiring (draining, then retired), each with when it was retired (ms).
    retiring: Mapping[str, int] = field(default_factory=dict)

    def route(self, own_version: str, draw: float) -> str:
        """The version of a job that names none: ``draw`` is uniform in [0, 100)."""
        return self.version if self.version and draw < self.percent else own_version

    def copies(self, served_version: str, draw: float) -> bool:
        """Whether a job served by ``served_version`` is copied to the shadow."""
        return bool(self.shadow) and served_version != self.shadow and \
            draw < self.shadow_percent

    def check_open(self, spec: ModelSpec) -> None:
        """Raise VersionRetiring (503) when ``spec``, a version of this model, is retiring."""
        if spec.version in self.retiring:
            raise VersionRetiring(f"version {spec.version!r} of model {spec.base_name!r} is "
                                  "retiring: it admits no new jobs (GET /models shows its "
                                  "drain); name another version, or none")

    def is_empty(self) -> bool:
        return not (self.version or self.shadow or self.retiring)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version or None, "percent": self.percent,
                "shadow": self.shadow or None, "shadow_percent": self.shadow_percent}


class Routed(Catalogue):
    """The catalogue as one request sees it: ``get`` answers the entry a job of that
    name goes to (``choose(entry addressed, name)``: carpool's web picks by rollout)."""

    _choose: Callable[[ModelSpec, str], ModelSpec]

    def __init__(self, models: Mapping[str, ModelSpec],
                 choose: Callable[[ModelSpec, str], ModelSpec]) -> None:
        super().__init__(models)
        object.__setattr__(self, "_choose", choose)

    def get(self, name: str) -> ModelSpec:
        return self._choose(super().get(name), name)


def percent_of(body: Mapping[str, Any], what: str) -> float:
    """The body's ``percent``, a number from 0 to 100; InvalidInput naming it if not."""
    raw = body.get("percent")
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) \
            or not 0 <= raw <= 100:
        raise InvalidInput(f"{what} needs 'percent', a number from 0 to 100 (the share of "
                           f"jobs), not {json.dumps(raw)[:40]}")
    return float(raw)


def change(current: Rollout, body: Any, versions: Sequence[str], own: str,
           now_ms: int) -> Rollout:
    """The state after a PUT ``body`` (one of CHANGES) on a model whose versions are
    ``versions`` (its own entry's, ``own``, first); InvalidInput (400) for a malformed
    body or an unknown version, RolloutConflict (409) for a change the state forbids."""
    if not isinstance(body, dict):
        raise InvalidInput('the body must be a JSON object: {"version": v, "percent": p}, '
                           '{"shadow": v, "percent": p} or {"retire": v}')
    asked = [k for k in CHANGES if k in body]
    allowed = {asked[0], *(["percent"] if asked[0] != "retire" else [])} if asked else set()
    if len(asked) != 1 or set(body) - allowed:
        raise InvalidInput(f"one change per request: 'version' or 'shadow' (with 'percent'), "
                           f"or 'retire'; got the fields {sorted(body)[:6]}")
    what = asked[0]
    version = body[what]
    if not isinstance(version, str) or version not in versions:
        raise InvalidInput(f"{what}: no version {json.dumps(version)[:40]}; the model's "
                           f"versions: {', '.join(versions)}")
    if what == "version":
        return _route_to(current, version, percent_of(body, "a rollout"), own)
    if what == "shadow":
        return _shadow_to(current, version, percent_of(body, "a shadow"), own)
    return _retire(current, version, own, now_ms)


def _route_to(current: Rollout, version: str, percent: float, own: str) -> Rollout:
    if version == own:
        raise InvalidInput(f"version {version!r} is the model's own entry, where jobs go "
                           "without a rollout: DELETE the rollout to send every job there")
    if version == current.shadow:
        raise InvalidInput(f"version {version!r} is the shadow; a version cannot both serve "
                           "and shadow: move the shadow first")
    if own in current.retiring and percent < 100:
        raise RolloutConflict(f"version {own!r}, the model's own entry, is retiring: the jobs "
                              "that name no version must all go to the rollout (percent 100; "
                              "DELETE the rollout to reopen it)")
    # Naming a retiring version here reopens it: the operator sends it jobs again.
    retiring = {v: t for v, t in current.retiring.items() if v != version}
    return replace(current, version=version, percent=percent, retiring=retiring)


def _shadow_to(current: Rollout, version: str, percent: float, own: str) -> Rollout:
    if version in (own, current.version):
        raise InvalidInput(f"version {version!r} serves the model's jobs; a shadow must be "
                           "another version")
    if version in current.retiring:
        raise RolloutConflict(f"version {version!r} is retiring and takes no new jobs, "
                              "copies included")
    return replace(current, shadow=version, shadow_percent=percent)


def _retire(current: Rollout, version: str, own: str, now_ms: int) -> Rollout:
    if version == current.shadow:
        raise RolloutConflict(f"version {version!r} is the shadow: PUT another shadow (or "
                              "percent 0) first")
    if version == own and (not current.version or current.percent < 100):
        raise RolloutConflict(f"version {version!r} is the model's own entry and still takes "
                              f"{100 - current.percent:g} % of the jobs that name no version: "
                              "PUT a rollout at percent 100 first")
    if version == current.version and current.percent > 0:
        raise RolloutConflict(f"version {version!r} takes {current.percent:g} % of the jobs "
                              "that name no version: PUT its percent to 0 first")
    return replace(current, retiring={**current.retiring,
                                      version: current.retiring.get(version, now_ms)})


def rolled_back(current: Rollout, own: str) -> Rollout:
    """``DELETE``: every job that names no version goes to the model's own entry again
    (reopened if it was retiring), and no job is shadowed."""
    return Rollout(retiring={v: t for v, t in current.retiring.items() if v != own})


def agrees(kind: str, served: Any, copy: Any, cosine_min: float = SHADOW_COSINE_MIN) -> bool:
    """Whether a shadow's result agrees with the served one: embeddings by cosine,
    classifications by their top-1 class, anything else when equal."""
    if kind in EMBEDDING_KINDS:
        return _cosine(_vector(served), _vector(copy)) >= cosine_min
    top_served, top_copy = _top1(served), _top1(copy)
    if top_served is not None or top_copy is not None:
        return top_served is not None and top_served == top_copy
    return bool(served == copy)


def _vector(result: Any) -> list[float]:
    found = result.get("embedding") if isinstance(result, dict) else None
    return found if isinstance(found, list) else []


def _cosine(a: list[float], b: list[float]) -> float:
    if not a or len(a) != len(b):
        return -1.0  # vectors of different widths never agree
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norms if norms else -1.0


def _top1(result: Any) -> Any:
    """The first class of an image model's ``top_k``; None for other results."""
    top = result.get("top_k") if isinstance(result, dict) else None
    if isinstance(top, list) and top and isinstance(top[0], dict):
        return top[0].get("index", top[0].get("label"))
    return None
