"""A load's config override read as the catalogue file's entry is (carpool/core/overrides.py):
merged over the entry in force, validated, and compared in one canonical text."""

from __future__ import annotations

import pytest

from carpool.core.catalogue import load_catalogue
from carpool.core.errors import ConfigError
from carpool.core.overrides import apply_stored, canonical, overridden, parse_override

RESNET = load_catalogue(None).get("resnet18")


def test_options_merge_over_the_entry_in_force_as_in_the_catalogue_file() -> None:
    spec = overridden(RESNET, parse_override('{"options": {"weights": "/m/r18.pth"}}'))
    assert spec.options == {**RESNET.options, "weights": "/m/r18.pth"}
    assert spec.bins == RESNET.bins
    stored = canonical({"options": {"weights": "/m/r18.pth"}})
    assert apply_stored(RESNET, stored) == spec
    assert apply_stored(RESNET, "") is RESNET and canonical({}) == ""


def test_two_spellings_of_one_override_are_one_text() -> None:
    assert canonical(parse_override('{ "options" : {"b": 1, "a": 2} }')) == \
        canonical({"options": {"a": 2, "b": 1}}) == '{"options":{"a":2,"b":1}}'


@pytest.mark.parametrize(("config", "says"), [
    ("{", "the override is not valid JSON"),
    ("[" * 100_000, "nested too deeply to parse"),
    ('{"options": {"threshold": Infinity}}', "Infinity is not valid JSON"),
    ("[]", "must be a JSON object"),
    ('{"colour": "red"}', "unknown keys ['colour']"),
    ('{"options": 5}', "options must be an object"),
    ('{"result_ttl_s": "long"}', "model 'resnet18'"),
    ('{"result_ttl_s": 0}', "result_ttl_s must be >= 1"),
])
def test_a_bad_override_is_a_config_error_naming_the_problem(config: str, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        overridden(RESNET, parse_override(config))
    assert says in str(raised.value)


def test_an_override_stored_before_strict_parsing_still_applies() -> None:
    """The web once took NaN in a load's config and stored it so: a worker reads it."""
    spec = apply_stored(RESNET, '{"options":{"weights":"/w.pt","scale":NaN}}')
    assert spec.options["weights"] == "/w.pt"
