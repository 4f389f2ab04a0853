#!/usr/bin/env bash
# The test command: bootstrap .venv (pinned CPU stack, skipped when up to date), then run pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not engine"`, `bash scripts/test.sh tests/core` or
# `bash scripts/test.sh --tier=full` (what .ci/run runs: every end-to-end launch).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/bootstrap_venv.sh
bash scripts/lib/install_sandbox.sh  # bubblewrap for the Python tool's sandbox tests (apt-get; never fatal)
source scripts/lib/cpu_env.sh
# Three pytest-xdist workers (tests/conftest.py): one holds the end-to-end launches, one the vLLM engines, one the rest.
# RECIPE_TEST_WORKERS=0, or -n or -p no:xdist in the arguments, runs as given instead.
workers="${RECIPE_TEST_WORKERS:-3}"
# --no-loadscope-reorder: the groups go out in the order tests/conftest.py sorts them (the e2e launches first).
xdist=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
[[ "$workers" == 0 ]] && xdist=()
for arg in "$@"; do
    case "$arg" in -n | -n[0-9]* | --numprocesses* | no:xdist) xdist=() ;; esac
done
exec "${RECIPE_VENV:-$ROOT/.venv}/bin/python" -m pytest "${xdist[@]}" "$@"
