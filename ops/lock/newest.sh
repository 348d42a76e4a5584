#!/usr/bin/env bash
# Tries the newest releases that pyproject.toml allows, on purpose, before a newcomer
# meets them: a throwaway venv without the lock, then ruff, mypy and the unit tests.
#
#   bash ops/lock/newest.sh          (about 5 minutes; the venv is .carpool/newest)
#
# Green: `bash ops/lock/refresh.sh --upgrade` moves the lock, then `bash .ci/run`.
# Red: the output says which release broke what; fix the code or cap the bound.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.carpool/newest
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q --upgrade -e '.[worker,local,dev,s3,bench,flower]'
"$VENV/bin/python" -m pip list --format=freeze > "$VENV/installed.txt"
echo "resolved: $(wc -l < "$VENV/installed.txt") packages (list in $VENV/installed.txt)"
"$VENV/bin/ruff" check carpool web worker tests ops
"$VENV/bin/mypy"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/unit
