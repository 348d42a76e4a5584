"""ops/bench/torch_options.py, the prepared measurement of dtype / channels_last /
compile against fp32, in miniature on the CPU (on a GPU it runs resnet50)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.procs import REPO_ROOT


def test_torch_options_bench_reports_each_variant_against_fp32_measured_in_the_same_run(
) -> None:
    out = subprocess.run(
        [sys.executable, "ops/bench/torch_options.py", "--device", "cpu", "--arch", "resnet18",
         "--crop", "32", "--batch", "2", "--reps", "1", "--warmup", "0",
         "--variants", "bf16,channels_last"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=True).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [line["variant"] for line in lines] == ["fp32", "bf16", "channels_last"]
    assert all(line["ms"] > 0 for line in lines)
    assert "| fp32 |" in out and "| 1.00 |" in out
