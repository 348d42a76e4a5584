"""Calibration profiles: latency per batch size of each bin shape, as JSON.

One file per device, model and bins (``<profile_dir>/<model>-<digest>.json``):
the digest covers the device's name, torch's version, the bins and the model's
options, so a changed catalogue or a different GPU never reuses a stale profile.
This module is plain data; ``worker.observe.calibrate`` measures.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from carpool.core.catalogue import ModelSpec
from carpool.scheduling.batching import Cost

log = logging.getLogger(__name__)

#: The knee: the largest batch whose time per item still beats the smaller sizes'
#: by this fraction; past it a bigger batch buys little throughput for its latency.
KNEE_GAIN = 0.10
PROFILE_VERSION = 1


@dataclass(frozen=True)
class Point:
    batch: int
    ms: float  # median wall time of one batch: copy in, forward, copy out

    @property
    def items_per_s(self) -> float:
        return self.batch / self.ms * 1000.0 if self.ms > 0 else 0.0


@dataclass
class BinProfile:
    bin: str
    shape: str
    points: list[Point] = field(default_factory=list)
    #: Largest batch that ran; ``out_of_memory_at`` is the first size that did not.
    largest_fit: int = 0
    out_of_memory_at: int | None = None

    @property
    def knee(self) -> int:
        """The largest batch whose time per item beats every smaller size's by KNEE_GAIN
        (one noisy step in between does not end the scan)."""
        if not self.points:
            return 1
        knee, best = self.points[0].batch, self.points[0].ms / self.points[0].batch
        for point in self.points[1:]:
            per_item = point.ms / point.batch
            if per_item <= (1 - KNEE_GAIN) * best:
                knee = point.batch
            best = min(best, per_item)
        return knee


@dataclass
class Profile:
    model: str
    device: str
    digest: str
    torch_version: str
    created: str
    bins: dict[str, BinProfile] = field(default_factory=dict)
    version: int = PROFILE_VERSION

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        for name, b in self.bins.items():
            body["bins"][name]["knee"] = b.knee
        return body

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Profile:
        bins = {}
        for name, b in raw["bins"].items():
            points = [Point(int(p["batch"]), float(p["ms"])) for p in b["points"]]
            bins[name] = BinProfile(b["bin"], b["shape"], points, int(b["largest_fit"]),
                                    b.get("out_of_memory_at"))
        return cls(raw["model"], raw["device"], raw["digest"], raw["torch_version"],
                   raw["created"], bins, int(raw.get("version", 0)))


def cost_seed(profile: BinProfile) -> Cost | None:
    """t(n) = a + b·n fitted by least squares to a bin's points (a, b >= 0): the seed
    of the worker's online cost model (carpool.scheduling.costmodel), which then follows the
    batches it really runs (preprocessing and Redis included, which calibration is
    not). None without two distinct batch sizes to tell a from b."""
    points = profile.points
    if len({p.batch for p in points}) < 2:
        return None
    k = len(points)
    mean_n = sum(p.batch for p in points) / k
    mean_t = sum(p.ms for p in points) / k
    var_n = sum((p.batch - mean_n) ** 2 for p in points) / k
    b = max(0.0, sum((p.batch - mean_n) * (p.ms - mean_t) for p in points) / k / var_n)
    a = mean_t - b * mean_n
    if a < 0:  # no fixed part: through the origin
        a, b = 0.0, sum(p.batch * p.ms for p in points) / sum(p.batch ** 2 for p in points)
    return Cost(a, b)


def cost_seeds(profile: Profile) -> dict[tuple[str, str], Cost]:
    """``cost_seed`` of each of the profile's bins that has one, by (model, bin)."""
    seeds = {(profile.model, name): cost_seed(b) for name, b in profile.bins.items()}
    return {key: seed for key, seed in seeds.items() if seed is not None}


def digest(spec: ModelSpec, device_name: str, torch_version: str) -> str:
    ident = {"device": device_name, "torch": torch_version, "model": spec.name,
             "bins": [asdict(b) for b in spec.bins], "options": dict(spec.options)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()


def path_for(profile_dir: Path, spec: ModelSpec, key: str) -> Path:
    return profile_dir / f"{spec.name}-{key[:16]}.json"


def load(path: Path, key: str) -> Profile | None:
    """The profile at ``path`` if it exists, parses and matches ``key``."""
    if not path.is_file():
        return None
    try:
        profile = Profile.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable calibration profile %s: %s", path, exc)
        return None
    if profile.digest != key or profile.version != PROFILE_VERSION:
        return None
    return profile


def save(profile: Profile, path: Path) -> bool:
    """Write ``profile`` to ``path``; False (and a warning) when the folder is not writable.

    A profile is a cache: a worker that cannot keep one serves on and calibrates again
    at its next start, rather than dying after the calibration it just ran.
    """
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(profile.to_json(), indent=2))
        tmp.replace(path)  # atomic: two workers starting at once never read half a file
    except OSError as exc:
        log.warning("calibration profile not saved to %s (%s): set CARPOOL_PROFILE_DIR to a "
                    "writable folder (a volume in a container) to keep it across restarts",
                    path, exc)
        return False
    return True


def table(profile: Profile) -> str:
    """The profile as a text table: one row per bin and batch size."""
    lines = [f"model {profile.model} on {profile.device} (torch {profile.torch_version})",
             f"{'bin':>8} {'shape':>18} {'batch':>6} {'ms':>10} {'items/s':>10} {'ms/item':>9}"]
    for b in profile.bins.values():
        for p in b.points:
            mark = "  <- knee" if p.batch == b.knee else ""
            lines.append(f"{b.bin:>8} {b.shape:>18} {p.batch:>6} {p.ms:>10.2f} "
                         f"{p.items_per_s:>10.1f} {p.ms / p.batch:>9.2f}{mark}")
        oom = f", out of memory at {b.out_of_memory_at}" if b.out_of_memory_at else ""
        lines.append(f"{b.bin:>8} knee {b.knee}, largest batch run {b.largest_fit}{oom}")
    return "\n".join(lines)
