"""A user's own handler (``kind = "python"``) that misbehaves, served by a real Celery
worker and gunicorn: each job still ends once, with an error a person can act on, and
the worker serves on (or exits for its supervisor to restart, saying why).
The handler is ``tests/support/misbehaving_model.py``."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import make_env
from tests.support.faults import spawn_worker, stop_process
from tests.support.misbehaving_model import LOAD_ERROR
from tests.support.procs import REPO_ROOT, start_web, start_worker, wait_until
from worker.loop.loop import EXIT_DEVICE_LOST

pytest.importorskip("torch")

CATALOGUE = """
[models.bad]
kind = "python"
handler = "tests.support.misbehaving_model:Misbehaving"
measure = "bytes"
input_schema = {{type = "object"}}
[models.bad.options]
load = "{load}"
[[models.bad.bins]]
name = "all"
max_size = 4096
max_batch = 8
max_wait_ms = 20
max_depth = 100
"""
#: Longest a test waits for one job's end.
WAIT_S = 60


def worker_env(redis_url: str, key_prefix: str, tmp: Path, load: str = "ok",
               **extra: str) -> dict[str, str]:
    config = tmp / "catalogue.toml"
    config.write_text(CATALOGUE.format(load=load))
    return make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(config), CARPOOL_DEVICE="cpu",
                    CARPOOL_PROFILE_DIR=str(tmp / "profiles"),
                    PYTHONPATH=os.pathsep.join([str(REPO_ROOT),
                                                os.environ.get("PYTHONPATH", "")]), **extra)


def submit(base: str, model: str, job_input: Any) -> str:
    r = requests.post(f"{base}/submit", json={"model": model, "input": job_input}, timeout=30)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def ended(base: str, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = requests.get(f"{base}/result/{job_id}?wait={WAIT_S}",
                                        timeout=WAIT_S + 30).json()
    assert body["status"] in ("done", "failed"), body
    return body


@pytest.fixture
def stack(redis_url: str, key_prefix: str, tmp_path: Path) -> Iterator[str]:
    env = worker_env(redis_url, key_prefix, tmp_path, CARPOOL_MODELS="bad")
    with start_web(env) as base, start_worker(env, "w1@own-faults",
                                              log_path=tmp_path / "worker.log"):
        yield base


def test_a_forward_pass_that_calls_sys_exit_fails_its_job_and_the_worker_serves_on(
        stack: str) -> None:
    bad, good = submit(stack, "bad", {"do": "exit"}), submit(stack, "bad", {"value": 1})
    failed = ended(stack, bad)
    assert failed["status"] == "failed", failed
    assert failed["error"] == "inference failed: the handler called sys.exit(3)", failed
    assert ended(stack, good)["status"] == "done"
    after = ended(stack, submit(stack, "bad", {"value": 2}))
    assert after["status"] == "done" and after["result"] == {"echo": 2}, after


#: What a worker says of a model whose load raises, or whose warm-up does.
LOAD_FAILURES = [("raise", f"model 'bad': its load failed: RuntimeError: {LOAD_ERROR}"),
                 ("warm_up", "model 'bad': its warm-up failed: ValueError: cannot run value 0")]


@pytest.mark.parametrize(("load", "reason"), LOAD_FAILURES)
def test_a_load_that_raises_leaves_the_model_out_of_a_worker_serving_every_model(
        redis_url: str, key_prefix: str, tmp_path: Path, load: str, reason: str) -> None:
    env = worker_env(redis_url, key_prefix, tmp_path, load=load)
    with start_web(env) as base, start_worker(env, "w1@every-model"):
        done = ended(base, submit(base, "synthetic", {"value": 1, "size": 3}))
        assert done["status"] == "done", done
        refused = requests.post(f"{base}/submit", json={"model": "bad", "input": {}},
                                timeout=30)
        assert refused.status_code == 503, refused.text
        assert reason in refused.json()["error"]["message"]


@pytest.mark.parametrize(("load", "reason"), LOAD_FAILURES)
def test_a_load_that_raises_stops_a_worker_that_must_serve_the_model_naming_it(
        redis_url: str, key_prefix: str, tmp_path: Path, load: str, reason: str) -> None:
    env = worker_env(redis_url, key_prefix, tmp_path, load=load, CARPOOL_MODELS="bad")
    log = tmp_path / "worker.log"
    with pytest.raises(RuntimeError, match="exited with"):
        with start_worker(env, "w1@must-serve", log_path=log):
            pass
    assert reason in log.read_text()


#: Short enough that a hang is seen in seconds: renewal stops past MAX_BATCH_MS.
HANG_ENV = {"CARPOOL_LEASE_MS": "1500", "CARPOOL_MAX_BATCH_MS": "3000",
            "CARPOOL_MAX_ATTEMPTS": "2"}
#: How long a hung worker may take to exit: MAX_BATCH_MS, a keeper tick, and slack.
HUNG_EXIT_S = 30


def hangs_and_exits(env: dict[str, str], node: str, log: Path) -> None:
    """A worker started with ``env`` takes the hanging job and exits for a restart."""
    with start_worker(env, node, log_path=log) as proc:
        assert proc.wait(HUNG_EXIT_S) == EXIT_DEVICE_LOST
    text = log.read_text()
    assert "is still computing after" in text and "past CARPOOL_MAX_BATCH_MS" in text, text


def test_a_forward_pass_that_hangs_exits_the_worker_and_its_job_fails_after_max_attempts(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    env = worker_env(redis_url, key_prefix, tmp_path, CARPOOL_MODELS="bad", **HANG_ENV)
    with start_web(env) as base:
        hung = submit(base, "bad", {"do": "hang"})
        # The worker would heartbeat and serve nothing, its compute thread taken for good.
        hangs_and_exits(env, "w1@hangs", tmp_path / "w1.log")
        view = requests.get(f"{base}/result/{hung}", timeout=10).json()
        assert view["status"] == "queued" and view["attempts"] == 1, view
        hangs_and_exits(env, "w2@hangs", tmp_path / "w2.log")  # its second attempt
        failed = ended(base, hung)
        assert failed["status"] == "failed" and "worker lost 2 times" in failed["error"], failed
        with start_worker(env, "w3@hangs"):  # a fresh one serves what comes next
            assert ended(base, submit(base, "bad", {"value": 7}))["result"] == {"echo": 7}


def test_a_worker_stopped_while_its_forward_pass_hangs_exits_after_its_grace(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    """SIGTERM: the batch outlasts the grace, its job is handed back, and the worker
    exits (Python's exit waited for the hung compute thread for ever)."""
    env = worker_env(redis_url, key_prefix, tmp_path, CARPOOL_MODELS="bad",
                     CARPOOL_STOP_GRACE_S="1")
    log = tmp_path / "worker.log"
    with start_web(env) as base, start_worker(env, "w1@stop-hung", log_path=log) as proc:
        hung = submit(base, "bad", {"do": "hang"})
        wait_until(lambda: requests.get(f"{base}/result/{hung}", timeout=10).json()[
            "status"] == "running", WAIT_S, "the hanging job to be running")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HUNG_EXIT_S) == 0  # a stop, as asked
        view = requests.get(f"{base}/result/{hung}", timeout=10).json()
    assert view["status"] == "queued" and view["attempts"] == 1, view
    assert "outlasted the 1 s grace" in log.read_text()


@pytest.mark.parametrize(("out", "returned"), [("dict", "dict"), ("none", "NoneType")])
def test_a_postprocess_that_returns_no_list_fails_its_batch_naming_what_it_returned(
        stack: str, out: str, returned: str) -> None:
    # A dict of as many keys as the batch has items listed as its keys: "done", "echo".
    failed = ended(stack, submit(stack, "bad", {"out": out, "value": 1}))
    assert failed["status"] == "failed", failed
    assert (f"handler for 'bad' returned a {returned} from postprocess, not a list with "
            "one result per item (1), in order") in failed["error"], failed


#: A worker per crash, then one that finishes: a crash's restart costs a worker start.
CRASH_ENV = {"CARPOOL_LEASE_MS": "1500", "CARPOOL_MAX_ATTEMPTS": "3"}


@pytest.mark.parametrize(("do", "status"), [("abort", -signal.SIGABRT), ("os_exit", 1),
                                            ("segfault", -signal.SIGSEGV)])
def test_a_forward_pass_that_kills_its_process_fails_its_job_after_max_attempts(
        redis_url: str, key_prefix: str, tmp_path: Path, do: str, status: int) -> None:
    env = worker_env(redis_url, key_prefix, tmp_path, CARPOOL_MODELS="bad", **CRASH_ENV)
    with start_web(env) as base:
        crash = submit(base, "bad", {"do": do})
        others = [submit(base, "bad", {"value": v}) for v in range(3)]
        exits = []
        for start in range(5):  # 3 crashes, then one that finishes
            log = tmp_path / f"w{start}.log"
            proc = spawn_worker(env, f"w{start}@crash", log)
            try:
                wait_until(lambda p=proc: p.poll() is not None or requests.get(  # type: ignore[misc]
                    f"{base}/result/{crash}", timeout=10).json()["status"] == "failed",
                    WAIT_S, "the worker to die or the crashing job to fail")
                if proc.poll() is None:
                    break
                exits.append(proc.returncode)
                if do != "os_exit":  # the crash names the handler's code that did it
                    out = log.with_suffix(".out").read_text()
                    assert "Fatal Python error" in out and "misbehaving_model.py" in out \
                        and "in forward" in out, out[-3000:]
            finally:
                stop_process(proc)
        failed = ended(base, crash)
        assert exits == [status] * 3
        assert failed["status"] == "failed" and "worker lost 3 times" in failed["error"], failed
        assert [ended(base, i)["result"] for i in others] == [{"echo": v} for v in range(3)]


def load(base: str, load_does: str) -> requests.Response:
    """The repository API's load of ``bad`` with ``options.load`` overridden."""
    config = json.dumps({"options": {"load": load_does}})
    return requests.post(f"{base}/v2/repository/models/bad/load",
                         json={"parameters": {"config": config}}, timeout=WAIT_S)


def test_a_worker_restarted_after_a_load_it_refused_starts_and_serves_the_next_load(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    """An override the handler's load refuses (the web cannot check a handler's own
    options) leaves the model refused; a worker restarted then starts, refusing it (it
    exited: none of its models loaded, a crash loop), and serves the corrected load."""
    env = worker_env(redis_url, key_prefix, tmp_path, CARPOOL_MODELS="bad")
    with start_web(env) as base:
        with start_worker(env, "w1@bad-load") as first:
            refused = load(base, "raise")
            assert refused.status_code == 400 and LOAD_ERROR in refused.text, refused.text
            first.kill()  # a crash, or a deploy, while the model is refused
            first.wait()
        log = tmp_path / "w2.log"
        with start_worker(env, "w2@bad-load", log_path=log):
            assert LOAD_ERROR in log.read_text()
            loaded = load(base, "ok")
            assert loaded.status_code == 200, loaded.text
            assert ended(base, submit(base, "bad", {"value": 5}))["result"] == {"echo": 5}


def test_a_forward_pass_raising_an_error_whose_str_raises_fails_its_job_alone(
        stack: str) -> None:
    bad, good = submit(stack, "bad", {"do": "raise_unprintable"}), submit(stack, "bad", {
        "value": 1})
    failed = ended(stack, bad)
    assert failed["error"] == ("inference failed: Unprintable: (its message could not be "
                               "read: RuntimeError)"), failed
    assert ended(stack, good)["result"] == {"echo": 1}
    assert ended(stack, submit(stack, "bad", {"value": 2}))["result"] == {"echo": 2}


def test_a_forward_pass_raising_a_base_exception_fails_its_job_and_the_worker_serves_on(
        stack: str) -> None:
    failed = ended(stack, submit(stack, "bad", {"do": "cancelled"}))
    assert failed["error"] == ("inference failed: CancelledError: the model's event loop "
                               "was cancelled"), failed
    assert ended(stack, submit(stack, "bad", {"value": 2}))["result"] == {"echo": 2}


def test_a_run_time_load_raising_a_base_exception_is_refused_and_the_worker_serves_on(
        stack: str) -> None:
    """It ended the batch loop's thread: the model stayed "loading" for ever."""
    refused = load(stack, "cancelled")
    assert refused.status_code == 400 and f"CancelledError: {LOAD_ERROR}" in refused.text, \
        refused.text
    assert load(stack, "ok").status_code == 200
    assert ended(stack, submit(stack, "bad", {"value": 3}))["result"] == {"echo": 3}
