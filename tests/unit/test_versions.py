"""A model's versions in the catalogue file (carpool/core/versions.py): each declared
version is an entry of its own, ``<m>@<v>``, its keys over the model's; a malformed
one stops the start naming its entry; the job document names the version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from carpool.core.catalogue import Catalogue, builtin_models, load_catalogue
from carpool.core.errors import ConfigError, UnknownModel
from carpool.core.input_limits import InputLimits
from carpool.core.jobs import view_from_record
from carpool.core.settings import load_settings
from carpool.core.versions import version_map
from carpool.intake.bulk_lines import parse_file
from carpool.intake.embeddings import embed_request
from carpool.intake.inputs import many_from_json, submission_from_json
from tests.support.bulk import CATALOGUE_TOML as HEMB_TOML

#: synthetic's version 2: other weights, a longer TTL, one bin of its own.
TWO_VERSIONS = """
[models.synthetic.options]
weights = "/w/one.pt"
[models.synthetic.versions.2]
result_ttl_s = 60
[models.synthetic.versions.2.options]
weights = "/w/two.pt"
[[models.synthetic.versions.2.bins]]
name = "all"
max_size = 1024
max_batch = 8
max_wait_ms = 5
max_depth = 100
"""


def catalogue_of(tmp_path: Path, text: str) -> Catalogue:
    path = tmp_path / "carpool.toml"
    path.write_text(text)
    return load_catalogue(path)


def test_a_version_is_its_own_entry_with_its_keys_over_the_models(tmp_path: Path) -> None:
    catalogue = catalogue_of(tmp_path, TWO_VERSIONS)
    own, two = catalogue.get("synthetic"), catalogue.get("synthetic@2")
    builtin = builtin_models()["synthetic"]
    assert (own.name, own.version, own.family, own.base_name) == (
        "synthetic", "1", "", "synthetic")
    assert (two.name, two.version, two.family, two.base_name) == (
        "synthetic@2", "2", "synthetic", "synthetic")
    assert own.options == {**builtin.options, "weights": "/w/one.pt"}
    assert two.options == {**own.options, "weights": "/w/two.pt"}  # merged key by key
    assert [b.name for b in two.bins] == ["all"] and own.bins == builtin.bins  # replaced whole
    assert (two.result_ttl_s, own.result_ttl_s) == (60, builtin.result_ttl_s)
    assert (two.kind, two.measure, two.max_input_bytes) == (
        own.kind, own.measure, own.max_input_bytes)  # the rest: the model's


def test_m_at_its_own_version_is_m_and_an_unknown_version_names_the_ones_there_are(
        tmp_path: Path) -> None:
    catalogue = catalogue_of(tmp_path, TWO_VERSIONS)
    assert catalogue.get("synthetic@1") is catalogue.get("synthetic")
    with pytest.raises(UnknownModel, match=r"model 'synthetic' has no version '7'; its "
                                           r"versions: 1, 2"):
        catalogue.get("synthetic@7")
    with pytest.raises(UnknownModel, match="unknown model 'nope@1'"):
        catalogue.get("nope@1")
    assert load_catalogue(None).get("synthetic@1").name == "synthetic"  # every model has "1"


def test_an_entrys_own_version_key_names_it(tmp_path: Path) -> None:
    catalogue = catalogue_of(tmp_path, '[models.synthetic]\nversion = 3\n'
                                       '[models.synthetic.versions.4]\nresult_ttl_s = 9\n')
    assert catalogue.get("synthetic").version == "3"  # TOML's integer 3 is the version "3"
    assert catalogue.get("synthetic@3").name == "synthetic"
    with pytest.raises(UnknownModel, match="its versions: 3, 4"):
        catalogue.get("synthetic@1")
    assert version_map(catalogue)["synthetic"] == "3"


@pytest.mark.parametrize(("text", "says"), [
    ('[models.synthetic.versions.2]\nweight = "x"\n',
     r"\[models.synthetic.versions.2\]: model 'synthetic': unknown keys \['weight'\]"),
    ('[models.synthetic.versions."2@b"]\n', r"\[models.synthetic.versions.2@b\]: a version is"),
    ('[models.synthetic.versions."a/b"]\n', r"\[models.synthetic.versions.a/b\]: a version is"),
    ('[models.synthetic.versions.""]\n', r"a version is 1 to 64"),
    ('[models.synthetic]\nversion = "x y"\n', r"\[models.synthetic\] version: a version is"),
    ('[models.synthetic.versions.1]\nresult_ttl_s = 5\n',
     r"\[models.synthetic.versions.1\]: version '1' is the entry's own"),
    ('[models.synthetic.versions.2]\nversion = "3"\n',
     r"\[models.synthetic.versions.2\]: \['version'\] cannot be set in a version"),
    ('[models.synthetic.versions.2.versions.3]\n',
     r"\[models.synthetic.versions.2\]: \['versions'\] cannot be set"),
    ('[models.synthetic]\nversions = 2\n', r"\[models.synthetic\] versions: a table of tables"),
    ('[models.synthetic.versions]\n2 = 5\n', r"\[models.synthetic.versions.2\]: a table"),
    ('[models."a@b"]\nkind = "synthetic"\n', r"may not hold '@'"),
    ('[models.synthetic.versions.2]\nresult_ttl_s = 0\n',
     r"model 'synthetic@2': result_ttl_s must be >= 1"),
    ('[models.synthetic.versions.2]\nfamily = "other"\n', r"unknown keys \['family'\]"),
])
def test_a_malformed_version_stops_the_start_naming_its_entry(
        tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        catalogue_of(tmp_path, text)


def test_carpool_models_names_a_version_by_its_catalogue_name(tmp_path: Path) -> None:
    (tmp_path / "carpool.toml").write_text(TWO_VERSIONS)
    env = {"CARPOOL_CONFIG": str(tmp_path / "carpool.toml")}
    served = load_settings({**env, "CARPOOL_MODELS": "synthetic@1,synthetic@2"}).worker_models
    assert served == ("synthetic", "synthetic@2")
    with pytest.raises(UnknownModel, match="its versions: 1, 2"):
        load_settings({**env, "CARPOOL_MODELS": "synthetic@3"})


def test_each_surface_resolves_m_at_v_to_that_versions_entry(tmp_path: Path) -> None:
    catalogue = catalogue_of(tmp_path, TWO_VERSIONS + HEMB_TOML.replace(
        "[[models.hemb.bins]]", "[models.hemb.versions.2.options]\ndim = 16\n"
                                "[[models.hemb.bins]]", 1))
    one = submission_from_json({"model": "synthetic@2", "input": {"value": 1, "size": 5}},
                               catalogue, InputLimits(), None)
    assert one.spec.name == "synthetic@2" and one.prepared.bin.name == "all"
    assert many_from_json({"model": "synthetic@2", "inputs": [{"value": 1, "size": 1}]},
                          catalogue).spec.name == "synthetic@2"
    embed = embed_request({"model": "hemb@2", "input": "hi"}, catalogue, InputLimits())
    assert embed.spec.name == "hemb@2" and embed.spec.options["dim"] == 16

    def bulk(*models: str) -> bytes:
        return "\n".join(json.dumps({"custom_id": f"c{i}", "method": "POST",
                                     "url": "/v1/embeddings",
                                     "body": {"model": m, "input": "hi"}})
                         for i, m in enumerate(models)).encode()

    parsed = parse_file(bulk("hemb@2", "hemb@2"), "/v1/embeddings", catalogue, InputLimits(), 9)
    assert parsed.errors == [] and parsed.spec is not None and parsed.spec.name == "hemb@2"
    mixed = parse_file(bulk("hemb", "hemb@2"), "/v1/embeddings", catalogue, InputLimits(), 9)
    assert "a batch serves one model" in mixed.errors[0]["message"]  # one version a batch


def test_a_job_document_names_its_model_and_version() -> None:
    queued = {"status": "queued", "model": "synthetic@2", "t_admit": "1"}
    assert view_from_record("j", queued).to_json()["model"] == "synthetic"
    assert view_from_record("j", queued).to_json()["model_version"] == "2"
    own = {**queued, "model": "synthetic"}
    assert view_from_record("j", own).model_version == "1"
    assert view_from_record("j", own, {"synthetic": "3"}).model_version == "3"
    ran = {**own, "status": "done", "result": "{}", "t_claim": "2", "t_done": "3",
           "batch": json.dumps({"id": "w:1", "model_version": "5"})}
    doc = view_from_record("j", ran, {"synthetic": "3"}).to_json()
    assert doc["model_version"] == "5" and doc["batch"]["id"] == "w:1"  # what ran it
