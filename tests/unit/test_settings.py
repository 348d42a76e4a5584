"""Settings and catalogue: bins, overrides, and contradictions refused by name."""

from pathlib import Path

import pytest

from carpool.core.catalogue import load_catalogue
from carpool.core.errors import ConfigError, InputTooLarge
from carpool.core.settings import api_key_digest, load_settings


def test_synthetic_sizes_land_in_the_smallest_bin_that_holds_them() -> None:
    spec = load_catalogue(None).get("synthetic")
    assert [spec.bin_for(n).name for n in (0, 64, 65, 256, 257, 1024)] == [
        "small", "small", "medium", "medium", "large", "large"]


def test_a_size_over_the_largest_bin_is_too_large() -> None:
    with pytest.raises(InputTooLarge, match="largest bin"):
        load_catalogue(None).get("synthetic").bin_for(1025)


def test_toml_overrides_a_builtin_model_and_adds_a_new_one(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("""
[models.synthetic]
result_ttl_s = 7
[models.tiny]
kind = "synthetic"
measure = "size"
[[models.tiny.bins]]
name = "only"
max_size = 10
max_batch = 2
max_wait_ms = 5
max_depth = 3
""")
    cat = load_catalogue(cfg)
    assert cat.get("synthetic").result_ttl_s == 7
    assert cat.get("tiny").bins[0].max_depth == 3


def test_max_batch_over_max_depth_is_refused_naming_both(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("""
[models.tiny]
kind = "synthetic"
measure = "size"
[[models.tiny.bins]]
name = "only"
max_size = 10
max_batch = 20
max_wait_ms = 5
max_depth = 3
""")
    with pytest.raises(ConfigError, match=r"max_batch \(20\).*max_depth \(3\)"):
        load_catalogue(cfg)


def test_max_wait_at_or_above_the_lease_is_refused_naming_both(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[[models.synthetic.bins]]\nname = 'x'\nmax_size = 9\nmax_batch = 2\n"
                   "max_wait_ms = 150\nmax_depth = 9\n")
    env = {"CARPOOL_LEASE_MS": "100", "CARPOOL_CONFIG": str(cfg)}
    with pytest.raises(ConfigError, match=r"max_wait_ms \(150\).*CARPOOL_LEASE_MS \(100\)"):
        load_settings(env)


def test_a_misspelled_redis_url_fails_instead_of_falling_back_to_localhost() -> None:
    with pytest.raises(ConfigError, match="CARPOOL_REDIS_URL"):
        load_settings({"CARPOOL_REDIS_URL": "redsi://cache:6379"})


def test_a_worker_model_not_in_the_catalogue_fails_at_start() -> None:
    with pytest.raises(Exception, match="unknown model 'nope'"):
        load_settings({"CARPOOL_MODELS": "synthetic,nope"})


def test_bad_synthetic_cost_is_refused() -> None:
    with pytest.raises(ConfigError, match="CARPOOL_SYNTHETIC_COST_MS"):
        load_settings({"CARPOOL_SYNTHETIC_COST_MS": "20"})


def test_gpu_and_worker_metrics_settings_are_read_and_checked() -> None:
    s = load_settings({"CARPOOL_GPU_CLAIM": "1", "CARPOOL_GPU_DEVICES": "GPU-a,GPU-b",
                       "CARPOOL_WORKER_METRICS_PORT": "0"})
    assert (s.gpu_claim, s.gpu_devices, s.worker_metrics_port) == (True, ("GPU-a", "GPU-b"), 0)
    assert load_settings({}).worker_metrics_port == 9100 and not load_settings({}).gpu_claim
    with pytest.raises(ConfigError, match="CARPOOL_GPU_CLAIM"):
        load_settings({"CARPOOL_GPU_CLAIM": "yes"})
    with pytest.raises(ConfigError, match="CARPOOL_WORKER_METRICS_PORT"):
        load_settings({"CARPOOL_WORKER_METRICS_PORT": "70000"})


def test_the_feeder_metrics_port_is_9400_unless_set_and_is_checked() -> None:
    assert load_settings({}).bulk.metrics_port == 9400
    assert load_settings({"CARPOOL_FEEDER_METRICS_PORT": "0"}).bulk.metrics_port == 0
    for bad in ("70000", "-1", "http"):
        with pytest.raises(ConfigError, match="CARPOOL_FEEDER_METRICS_PORT"):
            load_settings({"CARPOOL_FEEDER_METRICS_PORT": bad})


def test_a_gpu_list_without_the_gpu_claim_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match="CARPOOL_GPU_DEVICES.*CARPOOL_GPU_CLAIM"):
        load_settings({"CARPOOL_GPU_DEVICES": "GPU-a"})


def test_adaptive_batching_is_on_unless_turned_off_with_0() -> None:
    assert load_settings({}).adaptive_batching is True
    assert load_settings({"CARPOOL_ADAPTIVE_BATCHING": "0"}).adaptive_batching is False
    with pytest.raises(ConfigError, match="CARPOOL_ADAPTIVE_BATCHING"):
        load_settings({"CARPOOL_ADAPTIVE_BATCHING": "off"})


#: Two API keys, as an operator's keys file names them.
FLOOD, QUIET = "flood-key-0123456789abcdef", "quiet-key-0123456789abcdef"


def test_a_weight_in_the_keys_file_is_read(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"{FLOOD} weight=3\n{QUIET}\n")
    settings = load_settings({"CARPOOL_API_KEYS_FILE": str(keys)})
    assert settings.api_key_weights == {api_key_digest(FLOOD): 3.0}
    assert settings.api_key_digests == {api_key_digest(FLOOD), api_key_digest(QUIET)}
