#!/usr/bin/env bash
# Refreshes requirements/lock.txt: every direct and transitive dependency of every
# extra, pinned with its hashes, resolved for CPython 3.11 on x86_64 Linux.
#
#   bash ops/lock/refresh.sh                    (then run `bash .ci/run`, and commit both)
#   bash ops/lock/refresh.sh --upgrade-package redis    (move one package only)
#
# uv resolves in seconds from the index's metadata and writes pip-tools' format, which
# plain pip installs with `--require-hashes -r` (.ci/run); requirements/constraints.txt
# is the same pins without hashes, for `pip install -c` of a subset (the README's first
# command, the Docker images); ops/gpu/wheelhouse.sh reads its versions from the lock. Without
# --upgrade(-package), uv keeps every pin the lock already has that still fits pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/../.."
#: uv itself is pinned, so that two people refreshing get the same resolver.
UV_VERSION=0.13.9
TOOLS=.carpool/lock-tools
[ -x "$TOOLS/bin/uv" ] || { python3 -m venv "$TOOLS" && "$TOOLS/bin/pip" install -q "uv==$UV_VERSION"; }
"$TOOLS/bin/uv" pip compile pyproject.toml --all-extras --generate-hashes \
  --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  --index-url https://pypi.org/simple \
  --custom-compile-command "bash ops/lock/refresh.sh" \
  --output-file requirements/lock.txt "$@"
python3 ops/lock/lockfile.py --constraints > requirements/constraints.txt
