#!/usr/bin/env bash
# The GPU check: one prepared run, at most 8 minutes, on a machine with a CUDA GPU.
#
#   bash ops/gpu/check.sh [--dry-run] [OUT_DIR]      (OUT_DIR: .carpool/gpu-check)
#
# 1. the `gpu` tests (tests/unit/test_torch_executor_cuda.py), with -rs so that a skipped one says why;
# 2. ops/gpu/check.py: calibrates resnet50 (random weights), served vs offline best
#    batch vs per-job, copy/compute overlap from CUDA event timestamps, a forced
#    out-of-memory error and the memory guard's recovery.
# Everything lands under OUT_DIR: gpu-tests.xml (JUnit), gpu-tests.log, check.json,
# profile-resnet50.json. --dry-run runs the same steps on the CPU in miniature
# (tests/e2e/test_gpu_check.py runs it); the gpu tests then skip, and say so.
set -euo pipefail
cd "$(dirname "$0")/../.."

DRY=""
OUT=.carpool/gpu-check
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=--dry-run ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) OUT=$arg ;;
  esac
done
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# Budgets (seconds) that add up to under 8 minutes, model downloads excluded (none:
# random weights). The tests are three, each bounded by its own timeout.
TESTS_S=120
CHECK_S=330

status=0
timeout "$TESTS_S" python -m pytest -q -rs -p no:cacheprovider -m gpu tests/unit/test_torch_executor_cuda.py \
  --junitxml "$OUT/gpu-tests.xml" 2>&1 | tee "$OUT/gpu-tests.log" || status=1
timeout "$CHECK_S" python ops/gpu/check.py --out "$OUT" $DRY || status=1
echo "gpu check: $([ $status = 0 ] && echo ok || echo FAILED); see $OUT/check.json"
exit $status
