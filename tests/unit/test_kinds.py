"""carpool/core/kinds.py: every kind named once, read by the worker and the web alike."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from carpool.core.catalogue import builtin_models
from carpool.core.errors import ConfigError
from carpool.core.input_limits import InputLimits
from carpool.core.kinds import INPUT_FORMS, KINDS, kind_of
from carpool.core.settings import load_settings
from carpool.intake import inputs
from web.openapi import schemas
from worker.handlers import TORCH_KINDS, make_handler
from worker.handlers.synthetic import SyntheticHandler


def test_every_input_form_has_a_reader_and_a_schema_in_the_web() -> None:
    assert {k.input_form for k in KINDS.values()} <= set(INPUT_FORMS)
    assert set(inputs._READERS) == set(INPUT_FORMS) == set(schemas._SCHEMAS)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kinds_handler_is_a_function_where_the_table_says(kind: str) -> None:
    module, _, function = KINDS[kind].handler.partition(":")
    if KINDS[kind].torch:
        pytest.importorskip("torch")
    assert callable(getattr(importlib.import_module(module), function))


def test_the_worker_builds_its_handler_from_the_table() -> None:
    spec = builtin_models()["synthetic"]
    assert isinstance(make_handler(spec, load_settings({})), SyntheticHandler)
    assert TORCH_KINDS == {"image", "text", "python"}


def test_the_web_reads_each_builtin_models_input_by_its_kind() -> None:
    models = builtin_models()
    limits = InputLimits()
    assert inputs.prepare(models["synthetic"], {"value": 1, "size": 1}, limits).bin.name == "small"
    assert inputs.prepare(models["minilm"], {"text": "hello"}, limits).input_json
    assert "image_b64" in schemas.input_schema(models["resnet18"])["properties"]
    assert "max_chars" in inputs.input_limits(models["minilm"])


def test_a_kind_nobody_registered_is_refused_by_both() -> None:
    spec = replace(builtin_models()["synthetic"], kind="nonesuch")
    with pytest.raises(ConfigError, match="no handler for kind 'nonesuch'"):
        kind_of(spec)
    with pytest.raises(ConfigError, match="no handler for kind"):
        make_handler(spec, load_settings({}))
    with pytest.raises(ConfigError, match="no handler for kind"):
        inputs.prepare(spec, {"value": 1, "size": 1}, InputLimits())
