"""ops/gpu/check.sh, the prepared GPU check, in its dry run on the CPU: every
section runs (a real Celery worker for the served figures, the simulated CUDA
device for overlap and out of memory) and lands in check.json; and every pytest
run that may skip GPU tests says why (-rs)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
#: The script's own budget is about 5 minutes; its dry run takes well under one.
DRY_RUN_TIMEOUT_S = 280


@pytest.mark.timeout(DRY_RUN_TIMEOUT_S + 20)
def test_the_gpu_check_dry_run_writes_every_section_to_its_json(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check"
    proc = subprocess.run(["bash", str(ROOT / "ops" / "gpu" / "check.sh"), "--dry-run",
                           str(out)], capture_output=True, text=True,
                          timeout=DRY_RUN_TIMEOUT_S, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "check.json").read_text())
    assert report["dry_run"] is True
    errors = {k: v["error"] for k, v in report.items() if isinstance(v, dict) and "error" in v}
    assert errors == {}
    assert [p[0] for p in report["calibrate"]["points"]] == [1, 2]
    assert (out / "profile-resnet50.json").is_file()
    bench = report["bench"]
    assert bench["configured"]["done"] == bench["configured"]["jobs"]
    assert bench["per_job"]["mean_batch"] == 1.0
    overlap = report["overlap"]
    assert set(overlap["events_ms"]) == {"copy_start", "copy_end", "compute_start",
                                         "compute_end"}
    assert overlap["copy_2_ended_before_compute_1_ended"] is True
    oom = report["oom"]
    assert oom["out_of_memory_errors"] >= 1 and oom["failed_jobs"] == 0
    assert oom["cap_at_end"] < oom["batch_sizes"][0]
    assert max(oom["batch_sizes"][1:]) < oom["batch_sizes"][0]  # never the failed size again
    # The gpu tests skipped (no CUDA here), and -rs made them say why.
    assert "SKIPPED" in (out / "gpu-tests.log").read_text()
    assert "needs CUDA" in (out / "gpu-tests.log").read_text()


def test_every_pytest_run_that_may_skip_gpu_tests_reports_skips() -> None:
    for script in (ROOT / ".ci" / "run", ROOT / "ops" / "gpu" / "check.sh"):
        runs = [line for line in script.read_text().splitlines()
                if "-m pytest" in line and not line.lstrip().startswith("#")]
        assert runs and all(" -rs " in line for line in runs), (script, runs)
